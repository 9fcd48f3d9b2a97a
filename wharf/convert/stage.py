"""convert_round: stored collect dirs -> micro-batches, index.json and stats.json.

Everything is written into a temp dir beside the output and renamed into place at the end, so
bad input or an interruption never leaves a half-written convert dir behind. Jobs and the output
in object storage (s3://...) are read and written through their local mirrors (wharf/core/storage.py):
the jobs' parquet is pulled first, the micro-batches pushed after, index.json last.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from pathlib import Path

import numpy as np
import orjson
from tqdm import tqdm

from wharf.core.config import RunConfig
from wharf.core import lease, storage
from wharf.core.layout import JOB_FILES, CollectPaths, ConvertPaths, RunLayout
from wharf.core.round_state import require_manifest
from wharf.convert import batching
from wharf.convert.build import Built, build
from wharf.convert.reader import ConvertInputError, read_job
from wharf.core.batches import BatchFile, BatchIndex, save_micro_batch, write_index
from wharf.convert.rows import RowOptions
from wharf.convert.sft import build_sft, chat_renderer
from wharf.core.model_identity import trained_model

log = logging.getLogger("convert")

def job_dirs(cfg: RunConfig) -> list[Path]:
    if cfg.convert.jobs:
        return [storage.local_path(j) for j in cfg.convert.jobs]
    return [RunLayout.of(cfg.runs_dir, cfg.name).round(cfg.round).collect.root]


def out_paths(cfg: RunConfig) -> ConvertPaths:
    if cfg.convert.out_dir:
        return ConvertPaths(storage.local_path(cfg.convert.out_dir))
    return RunLayout.of(cfg.runs_dir, cfg.name).round(cfg.round).convert


def _write_batches(built: Built, cfg: RunConfig, tmp: Path, progress: bool) -> tuple[list[BatchFile], dict]:
    c = cfg.convert
    lengths = np.array([len(r) for r in built.rows], np.int64)
    plan = batching.plan_batches(lengths, c.max_tokens_per_batch, c.pad_multiple, c.seed, c.max_row_padding)
    adv, w = np.array(built.advantages), np.array(built.weights)
    ri, gi = np.array(built.rollout_index), np.array(built.group_index)
    files = []
    for n, idx in enumerate(tqdm(plan, desc="convert micro-batches", unit="batch", disable=not progress)):
        mb = batching.pack([built.rows[i] for i in idx], c.pad_multiple, adv[idx], w[idx], ri[idx], gi[idx])
        name = f"mb-{n:05d}.safetensors"
        save_micro_batch(mb, tmp / name)
        files.append(BatchFile(file=name, rows=len(idx), seq_len=mb.shape[1], tokens=int(lengths[idx].sum()),
                               loss_tokens=int(mb.completion_mask.numpy().sum()),  # numpy: no torch thread pool
                               rollouts=float(w[idx].sum())))
    padded = sum(f.rows * f.seq_len for f in files)
    rows_per = max(1, round(len(lengths) / len(plan))) if plan else 1
    naive = batching.naive_batches(len(lengths), rows_per, c.seed)
    pad = {"micro_batches": len(files), "padded": padded,
           "padding_fraction": 1 - int(lengths.sum()) / padded if padded else 0.0,
           "naive_padding_fraction": batching.padding_fraction(lengths, naive, c.pad_multiple),
           "naive_rows_per_batch": rows_per}
    return files, pad


def _publish(tmp: Path, out: Path) -> None:
    """Rename the finished temp dir into place; an older convert dir there is replaced."""
    old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def student_model_dir(cfg: RunConfig) -> Path:
    """The model the rows train: the served one (wharf/core/model_identity.py, as the trainer picks it)."""
    return trained_model(cfg).path


def refuse_text_only(jobs) -> None:
    """GRPO needs the sampling policy's own token ids and log-probs: text-only rollouts have none."""
    for j in jobs:
        if j.text_only:
            ids = sorted(j.text_only)
            named = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
            raise ConvertInputError(
                f"{j.dir}: {len(ids)} rollouts are text-only ({named}): recorded from an endpoint that returned "
                "no token ids (proxy.text_only) or imported (wharf import), so GRPO has no log-probs of the "
                "sampling policy to train on; convert them with convert.mode=sft (then train.objective=sft), "
                "or collect again from vLLM or the wharf engine")


def convert_round(cfg: RunConfig, progress: bool = True) -> dict:
    """Convert this round's collect dir (or convert.jobs) and return the stats it wrote; into the
    run's own round under the run's lease (one writer per run: wharf/core/lease.py)."""
    for d in job_dirs(cfg):  # reads first: a missing bucket or job is named by the job's URL
        storage.pull(d, JOB_FILES)
    if cfg.convert.out_dir:
        return _convert_round(cfg, progress)
    with lease.held(RunLayout.of(cfg.runs_dir, cfg.name).root, "wharf convert"):
        return _convert_round(cfg, progress)


def _convert_round(cfg: RunConfig, progress: bool) -> dict:
    t0 = time.perf_counter()
    c = cfg.convert
    dirs = job_dirs(cfg)
    out = out_paths(cfg)
    log.info("reading %d job(s) -> %s", len(dirs), storage.describe(out.root))
    if not c.jobs:  # the run's own round: rows no manifest vouches for are refused
        require_manifest(CollectPaths(dirs[0]), cfg.round)
    render = chat_renderer(student_model_dir(cfg)) if c.mode == "sft" else None
    jobs = [read_job(d, c.skip_bad, progress, render) for d in dirs]
    if c.mode == "grpo":
        refuse_text_only(jobs)
    seen: dict[str, Path] = {}
    for j in jobs:
        if j.job_id in seen:
            raise ConvertInputError(f"{j.dir}: job {j.job_id} is also {seen[j.job_id]}: the same job twice "
                                    f"would count its rollouts twice")
        seen[j.job_id] = j.dir
    t_read = time.perf_counter()
    opts = RowOptions(c.max_seq_len, c.overlong, c.length_completions, c.context_exceeded)
    if c.mode == "sft":
        built = build_sft(jobs, opts, c.sft.min_reward, c.null_reward, c.skip_bad)
    else:
        built = build(jobs, opts, c.advantage, c.std_eps, c.null_reward, c.skip_bad)
    t_build = time.perf_counter()
    out.root.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.root.with_name(f".{out.root.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        files, pad = _write_batches(built, cfg, tmp, progress)
        stats = {**built.stats, "batches": pad, "jobs_read": [storage.describe(d) for d in dirs],
                 "settings": {"mode": c.mode, "sft_min_reward": c.sft.min_reward,
                              **{k: getattr(c, k) for k in ("advantage", "std_eps", "null_reward", "max_seq_len",
                                                         "overlong", "length_completions", "context_exceeded",
                                                         "max_tokens_per_batch",
                                                         "max_row_padding", "pad_multiple", "seed", "skip_bad")}},
                 "wall_s": round(time.perf_counter() - t0, 3),
                 "phases_s": {"read": round(t_read - t0, 3), "rows_and_advantages": round(t_build - t_read, 3),
                              "micro_batches": round(time.perf_counter() - t_build, 3)}}
        write_index(BatchIndex(files=files, rollouts=built.rollouts, groups=built.groups,
                               jobs=[storage.describe(d) for d in dirs], pad_multiple=c.pad_multiple, seed=c.seed,
                               mode=c.mode),
                    ConvertPaths(tmp).index)
        ConvertPaths(tmp).stats.write_bytes(orjson.dumps(stats, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
        _publish(tmp, out.root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    storage.push(out.root, last=(out.index.name,), delete_stale=True)
    if progress:
        print(summary(stats, storage.describe(out.root)))
    return stats


def summary(s: dict, out: str | Path) -> str:
    """One screen: what was read, what was used, why the rest was left out."""
    r, g, rows, tok, b, pb = s["rollouts"], s["groups"], s["rows"], s["tokens"], s["batches"], s["prefix_breaks"]
    agents = ", ".join(f"{a}: {c.get('breaks', 0)}/{c.get('pairs', 0)}" for a, c in pb["by_agent"].items()) or "-"
    lines = [
        f"convert: {len(s['jobs'])} job(s) -> {out}",
        f"  rollouts  read {r['read']}, used {r['used']}, left out {r['left_out'] or 'none'}",
        f"  groups    used {g['used']}, dropped {g['dropped'] or 'none'}",
        f"  turns     read {s['turns']['read']} (error {s['turns']['error']}, abandoned {s['turns']['abandoned']}, "
        f"duplicates {s['turns']['duplicates_dropped']}, "
        f"orphans {s['turns']['orphans']}; {s['turns'].get('repeated_answers', 0)} of {s['turns']['used_calls']} "
        f"answers repeat the previous one, {s['turns'].get('cut_answers', 0)} ran to max_tokens)",
        f"  rows      {rows['count']} ({rows['merged']} merged, {rows['single_call']} single-call; "
        f"{rows['rows_per_rollout_mean']:.2f}/rollout, {rows['split_rollouts']} rollouts split), "
        f"truncated {rows['truncated']}, "
        f"dropped overlong {rows['dropped_overlong']}",
        f"  tokens    {tok['total']} ({tok['trainable']} trainable) in {b['micro_batches']} micro-batches, "
        f"padding {b['padding_fraction']:.1%} (naive pad-to-longest {b['naive_padding_fraction']:.1%})",
        f"  prefix breaks {pb['total']} in {len(pb['by_rollout'])} rollouts (breaks/pairs by agent: {agents})",
        "  masked/dropped " + (", ".join(f"{k}: {v.get('rollouts', 0)} rollouts, {v.get('tokens', 0)} tokens"
                                         for k, v in s.get("rules", {}).items()) or "none"),
    ]
    if s["skipped"]:
        lines.append(f"  SKIPPED {len(s['skipped'])} bad input(s) (convert.skip_bad): see stats.json 'skipped'")
    lines.append(f"  {s['wall_s']:.1f} s; stats: {out}/stats.json")
    return "\n".join(lines)
