"""Read one stored collect dir (a job) through wharf.schema, refusing bad input by name.

The turns' list columns stay flat numpy arrays (values + offsets): a call's prompt, completion
and log-probs are zero-copy slices of them, so nothing walks the tokens in Python.
"""
from __future__ import annotations

import functools
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from wharf.core import schema
from wharf.core.layout import CollectPaths
from wharf.convert.rows import Call
from wharf.core.errors import WharfError

log = logging.getLogger("convert")

# What convert needs of a turns shard (request and response JSON are most of its bytes).
COLUMNS = ["rollout_id", "turn", "sampling", "prompt_token_ids", "completion_token_ids", "completion_logprobs",
           "finish_reason", "status", "text_only"]
# ...and what a text-only call is rendered from (convert.mode=sft only)
TEXT_COLUMNS = ["api", "request", "response"]

DEFAULT_TEMPERATURE = 1.0  # the OpenAI/vLLM default, for a call whose sampling names none


class ConvertInputError(WharfError, ValueError):
    """Bad input: the message names the file (and rollout) and the reason."""


@dataclass
class Job:
    dir: Path
    job_id: str
    agent: str
    rollouts: list[dict]
    files: list[str] = field(default_factory=list)  # turns shards read
    skipped: list[dict] = field(default_factory=list)  # {file, rollout_id?, reason} (skip_bad)
    bad_rollouts: set[str] = field(default_factory=set)
    turns_read: int = 0
    stored_tokens: int = 0  # prompt + completion ids of every turn read
    turns_error: int = 0  # upstream failures
    turns_abandoned: int = 0  # calls the agent hung up on before the answer: not in its trajectory
    orphan_turns: int = 0
    orphan_rollouts: list[str] = field(default_factory=list)
    no_temperature: int = 0
    unflushed_wal: int = 0  # WAL segments left by a proxy that never folded them into shards
    turn_rows: Counter = field(default_factory=Counter)  # rollout_id -> turns rows read (ok or error)
    text_only: set[str] = field(default_factory=set)  # rollouts with a text-only call (no token ids)
    # rollout_id -> (file index, list of Call) in turn order
    calls: dict[str, tuple[int, list[Call]]] = field(default_factory=dict)


def _flat(col: pa.ChunkedArray, dtype) -> tuple[np.ndarray, np.ndarray]:
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    offsets = arr.offsets.to_numpy()
    values = arr.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return values, offsets


def _temperature(sampling: str | None) -> float | None:
    try:
        t = orjson.loads(sampling).get("temperature") if sampling else None
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None


def _bad(job: Job, skip_bad: bool, file, reason: str, rollout_id: str | None = None) -> None:
    where = f"{file}: rollout {rollout_id}: " if rollout_id else f"{file}: "
    if not skip_bad:
        raise ConvertInputError(f"{where}{reason} (convert.skip_bad=true skips it and lists it in stats.json)")
    job.skipped.append({"file": str(file), "rollout_id": rollout_id, "reason": reason})
    if rollout_id:
        job.bad_rollouts.add(rollout_id)


def _read_rollouts(paths: CollectPaths) -> list[dict]:
    if not paths.rollouts.exists():
        raise ConvertInputError(f"{paths.rollouts}: no rollouts table: collect has not finished this round, "
                                f"or {paths.root} is not a collect dir")
    try:
        rows = schema.read_table(paths.rollouts, "rollouts").to_pylist()
    except schema.SchemaError as e:
        raise ConvertInputError(str(e)) from None
    seen: set[str] = set()
    for r in rows:
        if r["rollout_id"] in seen:
            raise ConvertInputError(f"{paths.rollouts}: rollout {r['rollout_id']} appears twice")
        seen.add(r["rollout_id"])
    return sorted(rows, key=lambda r: r["rollout_id"])


def _manifest(paths: CollectPaths) -> dict:
    try:
        m = json.loads(paths.manifest.read_text())
    except (OSError, ValueError):
        return {}
    return m if isinstance(m, dict) else {}


def _refuse_running(paths: CollectPaths, manifest: dict) -> None:
    """A round still collecting (or killed mid-way) is not a job: its rollouts table grows, its
    shards are not folded, and in a bucket its files may be half there."""
    if manifest.get("state") == "running":
        raise ConvertInputError(f"{paths.manifest}: state is 'running': collect has not finished this round "
                                "(wait for it, or run collect again to finish a killed round) before converting it")


def read_job(directory: str | Path, skip_bad: bool = False, progress: bool = False,
             render: Callable | None = None) -> Job:
    """`render(api, request, response) -> (prompt ids, completion ids)` turns a text-only call into
    ids (convert.mode=sft); None: text-only calls are only noted (job.text_only), never rows."""
    paths = CollectPaths(Path(directory))
    manifest = _manifest(paths)
    _refuse_running(paths, manifest)
    rollouts = _read_rollouts(paths)  # without it nothing of the job is usable: always an error
    job_ids = {r["job_id"] for r in rollouts if r["job_id"]}
    agent = str(manifest.get("agent") or "unknown")
    job = Job(paths.root, job_ids.pop() if len(job_ids) == 1 else str(paths.root), agent, rollouts)
    if not paths.turns.is_dir():
        _bad(job, skip_bad, paths.turns, "no turns dir")
        return job
    known = {r["rollout_id"] for r in rollouts}
    if paths.wal.is_dir():
        job.unflushed_wal = sum(1 for p in paths.wal.glob("seg-*.jsonl") if p.stat().st_size)
        if job.unflushed_wal:
            log.warning("%s: %d write-ahead log file(s) not folded into shards: their calls are not read "
                        "(starting the proxy on this dir folds them)", paths.wal, job.unflushed_wal)
    files = schema.shard_files(paths.turns)
    for f in tqdm(files, desc=f"convert read {paths.root}", unit="shard", disable=not progress or len(files) < 2):
        try:
            table = schema.read_table(f, "turns", COLUMNS + (TEXT_COLUMNS if render else []))
        except schema.SchemaError as e:
            _bad(job, skip_bad, f, str(e).removeprefix(f"{f}: "))
            continue
        job.files.append(str(f))
        _add_shard(job, len(job.files) - 1, table, known, skip_bad, render)
    for _, calls in job.calls.values():
        calls.sort(key=lambda c: c.turn)  # a rollout's turns may span shards, in any order
    return job


def _add_shard(job: Job, file_index: int, table: pa.Table, known: set[str], skip_bad: bool,
               render: Callable | None) -> None:
    bad = functools.partial(_bad, job, skip_bad, job.files[file_index])
    ok = _count_turns(job, table)
    rids = table["rollout_id"].to_pylist()
    job.turn_rows.update(rids)
    turns = table["turn"].to_numpy()
    text = pc.fill_null(table["text_only"], False).to_numpy(zero_copy_only=False)
    _check_lengths(bad, table, ok & ~text, turns, rids)
    pv, po = _flat(table["prompt_token_ids"], np.int32)
    cv, co = _flat(table["completion_token_ids"], np.int32)
    lv, lo = _flat(table["completion_logprobs"], np.float32)
    finish = table["finish_reason"].to_pylist()
    samplings = table["sampling"].to_pylist()
    for i in np.flatnonzero(ok):
        rid = rids[i]
        if rid not in known:
            job.orphan_turns += 1
            if rid not in job.orphan_rollouts:
                job.orphan_rollouts.append(rid)
            continue
        temp = _call_temperature(job, bad, turns[i], samplings[i], rid)
        if temp is None:
            continue
        if not text[i]:
            call = Call(int(turns[i]), pv[po[i]:po[i + 1]], cv[co[i]:co[i + 1]], lv[lo[i]:lo[i + 1]], finish[i], temp)
        else:
            job.text_only.add(rid)
            call = _rendered_call(bad, table, i, finish[i], temp, render, rid) if render is not None else None
            if call is None:
                continue
        job.calls.setdefault(rid, (file_index, []))[1].append(call)


def _count_turns(job: Job, table: pa.Table) -> np.ndarray:
    """Count a shard's turns, tokens and failed calls into `job`; returns [rows] bool, True where ok
    (no table.filter: it would copy every token; error and abandoned rows are skipped by index)."""
    job.turns_read += table.num_rows
    job.stored_tokens += sum(pc.sum(pc.list_value_length(table[c])).as_py() or 0
                             for c in ("prompt_token_ids", "completion_token_ids"))
    ok = pc.fill_null(pc.equal(table["status"], "ok"), False).to_numpy(zero_copy_only=False)
    abandoned = int(pc.sum(pc.equal(table["status"], "abandoned")).as_py() or 0)
    job.turns_abandoned += abandoned
    job.turns_error += int((~ok).sum()) - abandoned
    return ok


def _check_lengths(bad: Callable, table: pa.Table, with_ids: np.ndarray, turns: np.ndarray, rids: list) -> None:
    """Refuse the calls (of those `with_ids`: ok and not text-only) whose ids do not line up: a
    log-prob per completion id, and a prompt."""
    n_c = pc.list_value_length(table["completion_token_ids"]).fill_null(0).to_numpy()
    n_l = pc.list_value_length(table["completion_logprobs"]).fill_null(0).to_numpy()
    n_p = pc.list_value_length(table["prompt_token_ids"]).fill_null(0).to_numpy()
    for i in np.flatnonzero(with_ids & (n_c != n_l)):
        bad(f"turn {turns[i]} has {n_c[i]} completion ids but {n_l[i]} log-probs", rids[i])
    for i in np.flatnonzero(with_ids & (n_p == 0)):
        bad(f"turn {turns[i]} is ok but has no prompt ids", rids[i])


def _call_temperature(job: Job, bad: Callable, turn, sampling: str | None, rid: str) -> float | None:
    """The temperature a call was sampled at (the default where it names none); None, once
    refused, for a greedy call."""
    temp = _temperature(sampling)
    if temp is None:
        job.no_temperature += 1
        return DEFAULT_TEMPERATURE
    if temp <= 0:
        bad(f"turn {turn} was sampled at temperature {temp} (greedy): the endpoint's log-probs are then not "
            "those of any distribution the trainer can recompute; collect again with sampling.temperature > 0", rid)
        return None
    return temp


def _rendered_call(bad: Callable, table: pa.Table, i: int, finish: str | None, temp: float, render: Callable,
                   rid: str) -> Call | None:
    """A text-only call as ids, rendered from its request and response (convert.mode=sft); None,
    once refused, when it cannot be rendered."""
    turn = table["turn"][i].as_py()
    try:
        prompt, completion = render(table["api"][i].as_py(), table["request"][i].as_py(), table["response"][i].as_py())
    except ValueError as e:
        bad(f"turn {turn}: a text-only call that cannot be rendered: {e}", rid)
        return None
    prompt, completion = np.asarray(prompt, np.int32), np.asarray(completion, np.int32)
    return Call(int(turn), prompt, completion, np.zeros(len(completion), np.float32), finish, temp)
