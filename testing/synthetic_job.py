"""A generated collect job (turns shards + rollouts.parquet, real parquet through wharf.schema)
for tests and bench/convert: rollouts of many calls whose prompts carry the whole history, as
agents send it, with prefix breaks (a re-tokenized end of the last completion), retried calls,
finish_reason=length completions and lengths spread like an agent's."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from wharf.core import schema
from wharf.core.layout import CollectPaths

VOCAB = 49_000
GROUP = 8  # attempts per task


def _list_array(parts: list[np.ndarray], dtype) -> pa.Array:
    offsets = np.zeros(len(parts) + 1, np.int64)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    values = np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values)).cast(
        pa.list_(pa.from_numpy_dtype(dtype)))


def _ids(rng: np.random.Generator, lo: float, hi: float) -> np.ndarray:
    return rng.integers(1, VOCAB, int(rng.integers(max(1, int(lo)), max(2, int(hi)))), dtype=np.int32)


def _rollout(rng: np.random.Generator, scale: float, turns: tuple[int, int] = (8, 25)) -> tuple[list, list, list]:
    """One rollout's calls: prompts, completions, finish reasons."""
    history = _ids(rng, 300 * scale, 1500 * scale)  # system + task
    n = int(rng.integers(*turns))
    prompts, comps, finish = [], [], []
    for t in range(n):
        if t:
            if rng.random() < 0.3:  # the template re-tokenizes the end of the last completion
                history = history.copy()
                history[-1] = history[-1] % (VOCAB - 1) + 1
            glue = _ids(rng, 10 * scale, 400 * scale)  # tool output
            history = np.concatenate([history, glue])
        if t and rng.random() < 0.03:  # a retried call: same prompt again
            prompts.append(prompts[-1])
            comps.append(_ids(rng, 20 * scale, 300 * scale))
            finish.append("stop")
        comp = _ids(rng, 20 * scale, 300 * scale)
        prompts.append(history)
        comps.append(comp)
        finish.append("length" if rng.random() < 0.05 else "stop")
        history = np.concatenate([history, comp])
    return prompts, comps, finish


def make_job(root: Path, n_rollouts: int, seed: int = 0, shards: int = 8, size: float = 1.0,
             turns: tuple[int, int] = (8, 25)) -> dict:
    """Write a collect dir (turns shards + rollouts.parquet) of generated rollouts; `size` scales
    their token counts (tests use small ones)."""
    rng = np.random.default_rng(seed)
    paths = CollectPaths(root)
    rollouts, turns_rows = [], []
    stored = 0
    for i in range(n_rollouts):
        rid, group = f"r{i:05d}", f"task-{i // GROUP:04d}"
        scale = float(np.clip(rng.lognormal(0.0, 0.6), 0.2, 3.0))  # agents' trajectories vary in length a lot
        prompts, comps, finish = _rollout(rng, scale * size, turns)
        turns_rows.append((rid, prompts, comps, finish))
        stored += sum(len(p) + len(c) for p, c in zip(prompts, comps))
        rollouts.append({"rollout_id": f"{rid}", "job_id": f"bench-{seed}", "round": 0, "task_id": group,
                         "group_id": group, "attempt": i % GROUP, "policy": "bench", "reward": float(rng.random() < 0.4),
                         "rewards": "{}", "status": "ok", "n_turns": len(prompts), "started_at": 0.0,
                         "ended_at": 1.0, "trial_dir": f"harbor/{rid}", "error": None})
    schema.write_table(paths.rollouts, "rollouts", rollouts)
    per = -(-len(turns_rows) // shards)
    for s in range(shards):
        chunk = turns_rows[s * per:(s + 1) * per]
        if chunk:
            schema.write_table(paths.turns / f"part-{s:05d}.parquet", "turns", _turns_table(chunk))
    return {"rollouts": n_rollouts, "turns": sum(len(t[1]) for t in turns_rows), "stored_tokens": stored}


def _turns_table(chunk) -> pa.Table:
    rid, turn, prompts, comps, finish = [], [], [], [], []
    for r, ps, cs, fs in chunk:
        rid += [r] * len(ps)
        turn += list(range(len(ps)))
        prompts += ps
        comps += cs
        finish += fs
    n = len(rid)
    lps = [-np.abs(np.sin(np.arange(len(c), dtype=np.float32))) for c in comps]
    ts = pa.array(np.zeros(n, "datetime64[us]"), pa.timestamp("us")).cast(pa.timestamp("us", tz="UTC"))
    sampling = [json.dumps({"temperature": 1.0, "top_p": 1.0, "seed": i, "logprobs": True}) for i in range(n)]
    cols = {"rollout_id": pa.array(rid), "turn": pa.array(turn, pa.int32()), "request_id": pa.array([f"q{i}" for i in range(n)]),
            "api": pa.array(["chat"] * n), "policy": pa.array(["bench"] * n), "started_at": ts, "ended_at": ts,
            "request": pa.array(["{}"] * n), "response": pa.array(["{}"] * n), "sampling": pa.array(sampling),
            "prompt_token_ids": _list_array(prompts, np.int32), "completion_token_ids": _list_array(comps, np.int32),
            "completion_logprobs": _list_array(lps, np.float32), "finish_reason": pa.array(finish),
            "status": pa.array(["ok"] * n), "error": pa.array([None] * n, pa.string()),
            "text_only": pa.array([False] * n)}
    return pa.Table.from_pydict(cols, schema=schema.TURNS)
