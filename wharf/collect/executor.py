"""Where a round's trials run (collect.executor): `local`, every trial on this machine behind one
proxy, or `ray`, spread over a Ray cluster's nodes (wharf/collect/ray_executor.py), each node with its
own proxy. Either way the driver gets one RolloutRow per finished trial, as it finishes, and
writes rollouts.parquet and manifest.json itself."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol

from wharf.collect.node import NodeTrials, OnRow
from wharf.collect.tasksets import PlannedRollout
from wharf.core.config import RunConfig


class Executor(Protocol):
    async def run(self, todo: list[PlannedRollout], job_id: str, on_row: OnRow) -> dict:
        """Run every planned rollout once; returns what the manifest records about the executor."""
        ...


class LocalExecutor:
    """All trials here, behind one proxy writing the round's turns dir (the default)."""

    def __init__(self, cfg: RunConfig, policy: str, config_path: Path):
        self.cfg, self.policy, self.config_path = cfg, policy, config_path

    async def run(self, todo: list[PlannedRollout], job_id: str, on_row: OnRow) -> dict:
        logs = self.cfg.round_layout.collect.logs
        async with NodeTrials(self.cfg, self.policy, self.config_path, logs / "proxy.log") as node:
            async def one(p: PlannedRollout) -> None:
                on_row(await node.trial(p, job_id), "local")
            await asyncio.gather(*(one(p) for p in todo))
        return {}


def check_executor(cfg: RunConfig) -> None:
    """Refuse an executor that cannot run here before anything starts (the endpoint included)."""
    if cfg.collect.executor == "ray":
        from wharf.collect.ray_executor import require_ray
        require_ray()


def make_executor(cfg: RunConfig, policy: str, config_path: Path) -> Executor:
    if cfg.collect.executor == "ray":
        from wharf.collect.ray_executor import RayExecutor  # ray is an optional extra
        return RayExecutor(cfg, policy)
    return LocalExecutor(cfg, policy, config_path)
