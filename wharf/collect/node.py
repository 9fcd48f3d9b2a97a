"""The trials of one node: its own recording proxy, its own harbor trial queue, and the row each
trial ends in. The local executor runs one of these in the driver; the Ray executor one per node."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import socket
from pathlib import Path
from typing import Callable

import aiohttp

from wharf.collect.proxy_client import ProxyAdmin, ServiceError, proxy_process
from wharf.collect.records import ClosedRollout, Outcome, RolloutRow
from wharf.collect.tasksets import PlannedRollout, new_rollout_id, rollout_seed
from wharf.collect.trials import RolloutRoute, classify, trial_config, with_judge_reason
from wharf.core.config import RunConfig
from wharf.core.config_redact import scrub_json_files, secret_values
from wharf.core.errors import WharfError
from wharf.core.layout import wal_dir

log = logging.getLogger("wharf.collect")

class NotPublished(WharfError, RuntimeError):
    """A closed rollout's rows could not be put in the run's storage: its trial does not count."""


# Called in the driver for each finished trial, with the name of the node that ran it.
OnRow = Callable[[RolloutRow, str], None]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host if host != "0.0.0.0" else "", 0))
        return s.getsockname()[1]


def node_proxy(cfg: RunConfig, node: str, node_ip: str) -> RunConfig:
    """`cfg` for the proxy of cluster node `node`: a port of its own (nodes may share a host), a
    write-ahead log of its own, so that two proxies never fold each other's segments, and, when
    it listens on every interface, the node's own address handed to the agents."""
    turns = cfg.round_layout.collect.turns
    port = free_port(cfg.proxy.host)
    public = f"http://{node_ip}:{port}" if cfg.proxy.host == "0.0.0.0" else None
    proxy = dataclasses.replace(cfg.proxy, port=port, public_url=public,
                                wal_dir=str(wal_dir(turns).with_name(f"_wal-{node}")))
    return dataclasses.replace(cfg, proxy=proxy)


class NodeTrials:
    """`async with NodeTrials(...) as node: row = await node.trial(p, job_id)`: at most
    collect.concurrency trials at once, every model call through this node's proxy."""

    def __init__(self, cfg: RunConfig, policy: str, config_path: Path, log_path: Path):
        """`config_path`: where the proxy's config file is written; `log_path`: its log."""
        self.cfg = cfg
        self.paths = cfg.round_layout.collect
        self.policy = policy
        self._config_path = config_path
        self._log_path = log_path
        self._secrets = secret_values(cfg)  # what no trial's record may keep
        self._stack = contextlib.AsyncExitStack()
        self.unpublished: set[str] = set()  # closed rollouts whose rows are still only in the WAL

    async def __aenter__(self) -> "NodeTrials":
        from harbor.models.job.config import RetryConfig
        from harbor.trial.queue import TrialQueue

        access = self._stack.enter_context(proxy_process(self.cfg, self._config_path, self.paths.turns, self._log_path))
        self.admin = await self._stack.enter_async_context(ProxyAdmin(access.url, access.token))
        self.queue = TrialQueue(n_concurrent=self.cfg.collect.concurrency, retry_config=RetryConfig(max_retries=0))
        self.sem = asyncio.Semaphore(self.cfg.collect.concurrency)
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            if exc[0] is None:
                await self.admin.flush()
        finally:
            await self._stack.aclose()

    async def trial(self, p: PlannedRollout, job_id: str) -> RolloutRow:
        async with self.sem:
            return await self._trial(p, job_id)

    async def publish(self, rollout_id: str, tries: int = 3, wait_s: float = 1.0) -> None:
        """Return once the rows of `rollout_id` are in a shard in the run's storage (a close whose
        upload failed left them in this node's WAL); raise NotPublished if the store keeps
        refusing. A node's WAL is on its own disk: its rows count only once they are published."""
        for i in range(tries):
            if rollout_id not in self.unpublished:
                return
            before = set(self.unpublished)
            try:
                await self.admin.flush()  # publishes every row recorded before it
                self.unpublished -= before
            except (ServiceError, aiohttp.ClientError, asyncio.TimeoutError) as e:
                log.warning("publishing the rows of rollout %s failed (try %d of %d): %s", rollout_id, i + 1, tries, e)
                await asyncio.sleep(wait_s * 2 ** i)
        if rollout_id in self.unpublished:
            raise NotPublished(f"the turns of rollout {rollout_id} could not be published from this node "
                               f"({tries} tries): they stay in its WAL, the trial runs again elsewhere")

    async def _trial(self, p: PlannedRollout, job_id: str) -> RolloutRow:
        cfg = self.cfg
        rollout_id = new_rollout_id(job_id, p)
        started = _now()
        opened = await self.admin.open(rollout_id, self.policy, rollout_seed(cfg.sampling.seed, cfg.round, p))
        ep = RolloutRoute(opened.base_url, opened.api_key, self.policy)
        tc = trial_config(cfg.collect, p.task.path, rollout_id, self.paths.harbor, ep)
        try:
            result = await self.queue.submit(tc)
            crash = None
        except Exception as e:  # harbor itself failed: not the policy's fault
            log.exception("trial %s crashed in harbor", rollout_id)
            result, crash = None, f"{type(e).__name__}: {e}"
        closed, close_error = await close_rollout(self.admin, rollout_id)
        n_turns, n_errors = (closed.n_turns, closed.n_errors) if closed else (0, 0)
        if closed is not None and not closed.published:
            self.unpublished.add(rollout_id)
        # the trial's own record (harbor's config.json, result.json) keeps no credential of the run
        scrub_json_files(self.paths.trial(rollout_id), [*self._secrets, opened.api_key])
        if result is None or close_error:
            outcome = Outcome("infra_error", None, {}, crash or close_error)
        else:
            outcome = with_judge_reason(classify(result, upstream_errors=n_errors), self.paths.trial(rollout_id))
        return RolloutRow(
            rollout_id=rollout_id, job_id=job_id, round=cfg.round, task_id=p.task.task_id,
            group_id=f"{job_id[:8]}.{p.group_id}", attempt=p.attempt, policy=self.policy,
            reward=outcome.reward, rewards=json.dumps(outcome.rewards), status=outcome.status,
            n_turns=n_turns, n_errors=n_errors, started_at=started, ended_at=_now(),
            trial_dir=str(self.paths.trial(rollout_id).relative_to(self.paths.root)), error=outcome.error,
        )



async def close_rollout(admin: ProxyAdmin, rollout_id: str) -> tuple[ClosedRollout | None, str | None]:
    """The proxy's answer to a rollout's close; a close that fails (e.g. a call the agent gave up
    on still running upstream past the admin timeout) costs this rollout, not the round."""
    try:
        return await admin.close(rollout_id), None
    except (ServiceError, aiohttp.ClientError, asyncio.TimeoutError) as e:
        log.warning("closing rollout %s on the proxy failed: %s", rollout_id, e)
        return None, f"proxy close failed: {type(e).__name__}: {e}"
