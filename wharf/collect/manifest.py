"""A collect round's summary and its manifest.json: what it planned, what finished, how it went.

Pure functions build the manifest's fields; `write_json` writes it atomically and durably.
"""
from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from wharf.core import atomic
from wharf.core.config import RunConfig
from wharf.core.layout import CollectPaths
from wharf.collect.proxy_client import ServiceError
from wharf.collect.records import RolloutRow


@dataclass
class RoundSummary:
    job_id: str
    planned: int
    rows: list[RolloutRow] = field(default_factory=list)
    resumed: int = 0
    nodes: dict[str, int] = field(default_factory=dict)  # trials finished by this run, per node
    text_only: list[str] = field(default_factory=list)  # rollouts recorded without token ids (SFT rows only)
    prefix_cache: dict | None = None  # the endpoints' prompt tokens and prefix-cache hits during the round

    @property
    def counts(self) -> dict[str, int]:
        return dict(Counter(r.status for r in self.rows))

    @property
    def mean_reward(self) -> float | None:
        rewards = [r.reward for r in self.rows if r.reward is not None]
        return sum(rewards) / len(rewards) if rewards else None

    def mixed_groups(self) -> list[str]:
        """Groups with both a success and a failure: the only ones GRPO learns from."""
        by_group: dict[str, set] = {}
        for r in self.rows:
            if r.reward is not None:
                by_group.setdefault(r.group_id, set()).add(r.reward > 0)
        return sorted(g for g, seen in by_group.items() if seen == {True, False})


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def load_manifest(paths: CollectPaths) -> dict:
    if not paths.manifest.exists():
        return {}
    try:
        return json.loads(paths.manifest.read_text())
    except json.JSONDecodeError as e:
        raise ServiceError(f"{paths.manifest}: not valid JSON ({e}); move it aside to start the round afresh") from None


def write_json(path: Path, data: dict) -> None:
    """Atomically and durably (file fsync, rename, directory fsync), as schema.write_table does."""
    atomic.write_json(path, data, indent=2, default=str, durable=True)


def started_manifest(cfg: RunConfig, policy: str, task_ids: list[str], job_id: str, prev: dict) -> dict:
    """The manifest of a round under way (`prev`: a resumed round's, whose start it keeps)."""
    cc = cfg.collect
    return {
        "job_id": job_id, "round": cfg.round, "policy": policy, "dataset": str(cc.dataset),
        "tasks": task_ids, "attempts": cc.attempts, "agent": cc.agent, "environment": cc.environment,
        "sampling": {"temperature": cfg.sampling.temperature, "top_p": cfg.sampling.top_p,
                     "seed": cfg.sampling.seed},
        "started_at": prev.get("started_at") or now().isoformat(), "state": "running",
    }


def finished_fields(summary: RoundSummary, planned: int, orphaned: dict[str, int], wall_s: float) -> dict:
    """What a finished round adds to its manifest (`wall_s` summed over resumed runs)."""
    return {
        "text_only_rollouts": summary.text_only,
        "orphan_turns": sum(orphaned.values()), "orphan_rollouts": len(orphaned),
        "state": "done", "ended_at": now().isoformat(), "wall_s": round(wall_s, 1),
        "counts": {"planned": planned, "finished": len(summary.rows), "resumed": summary.resumed,
                   "by_status": summary.counts},
        "mean_reward": summary.mean_reward, "mixed_groups": summary.mixed_groups(),
        "success_rate_by_task": success_by_task(summary.rows),
    }


def success_by_task(rows: list[RolloutRow]) -> dict[str, float]:
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(r.task_id, []).append(1.0 if (r.reward or 0) > 0 else 0.0)
    return {k: sum(v) / len(v) for k, v in sorted(by.items())}


def prefix_cache_summary(before: tuple[float, float], after: tuple[float, float] | None,
                         prev: dict | None = None) -> dict | None:
    """Prompt tokens the endpoints looked up during the round and how many came from the prefix
    cache (added to a resumed round's earlier runs); None if an endpoint restarted meanwhile."""
    if after is None or after[0] < before[0] or after[1] < before[1]:
        return None
    prompt = after[0] - before[0] + (prev or {}).get("prompt_tokens", 0)
    cached = after[1] - before[1] + (prev or {}).get("cached_tokens", 0)
    return {"prompt_tokens": int(prompt), "cached_tokens": int(cached),
            "hit_rate": round(cached / prompt, 4) if prompt else None}
