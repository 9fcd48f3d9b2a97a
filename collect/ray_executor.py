"""collect.executor=ray: a round's trials spread over the nodes of a Ray cluster.

Each node with a CPU to give gets one actor, pinned to it, that runs its own recording proxy and
its own harbor trials (collect/node.py) and writes its shards into the round's turns dir. The
driver hands each node up to collect.concurrency trials at a time and records each row as it
comes back, exactly as the local executor does. A node whose actor does not start within
collect.ray_ready_timeout_s is left out of the round and named. A node lost mid-round (its actor
dies with it), or failing in a way its own trial handling does not catch (its proxy died): the
trials it had not returned run again on the nodes left, under fresh rollout ids, so turns of
the abandoned tries stay orphans that convert ignores (the resume rules of collect/runner.py).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from pathlib import Path
from typing import Awaitable, Callable

from collect.node import NodeTrials, OnRow, node_proxy
from collect.records import RolloutRow
from collect.tasksets import PlannedRollout
from wharf import storage
from wharf.config import RunConfig
from wharf.errors import WharfError

log = logging.getLogger("wharf.collect")


class RayExecutorError(WharfError, RuntimeError):
    """The Ray cluster could not run the round (not installed, no node to run on, all nodes lost)."""


def require_ray():
    try:
        import ray
    except ImportError:
        raise RayExecutorError("collect.executor=ray needs Ray: pip install -e '.[ray]' (or set "
                               "collect.executor=local)") from None
    return ray


class NodeActor:
    """One node's trials (a Ray actor; its methods run on the actor's one event loop)."""

    def __init__(self, cfg: RunConfig, policy: str, node: str, cwd: str):
        if os.path.isdir(cwd):  # a node sharing the driver's disk resolves relative paths the same way
            os.chdir(cwd)
        import ray

        cfg = node_proxy(cfg, node, ray.util.get_node_ip_address())
        paths = cfg.round_layout.collect
        self.node = NodeTrials(cfg, policy, paths.proxy_config.with_name(f"proxy-{node}.yaml"),
                               paths.logs / f"proxy-{node}.log")
        self._up: asyncio.Future | None = None
        self._unpushed: list = []  # trial dirs whose upload failed: retried at finish

    def ready(self) -> bool:
        """Answers once the actor runs on its node (the driver's readiness probe)."""
        return True

    async def trial(self, p: PlannedRollout, job_id: str) -> RolloutRow:
        if self._up is None:  # the proxy starts with the first trial, on the actor's event loop
            self._up = asyncio.ensure_future(self.node.__aenter__())
        await asyncio.shield(self._up)
        row = await self.node.trial(p, job_id)
        # In object storage the trial's logs go up from here: the driver's mirror never sees this node's disk.
        # A failed upload costs no finished, scored trial: it is retried when the node finishes.
        try:
            await asyncio.to_thread(storage.push, self.node.paths.root / row.trial_dir)
        except storage.StorageError as e:
            log.warning("uploading the logs of trial %s failed (retried at the node's end): %s", row.rollout_id, e)
            self._unpushed.append(self.node.paths.root / row.trial_dir)
        return row

    async def finish(self) -> None:
        """Flush the proxy's shards, upload the trial logs that failed to go up, and stop the proxy."""
        if self._up is not None:
            await self._up
            await self.node.__aexit__(None, None, None)
        for d in self._unpushed:
            await asyncio.to_thread(storage.push, d)
        if self.node._log_path.is_file():  # the node's proxy log: the driver's mirror never sees this disk
            await asyncio.to_thread(storage.push_file, self.node._log_path)


def trial_nodes(nodes: list[dict]) -> dict[str, str]:
    """{name: Ray node id} of the alive nodes that have a CPU for a node actor."""
    return {n["NodeID"][:12]: n["NodeID"] for n in nodes
            if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= 1}


Submit = Callable[[PlannedRollout], Awaitable[RolloutRow]]


async def dispatch(submit: dict[str, Submit], slots: int, todo: list[PlannedRollout], on_row: OnRow,
                   lost_errors: tuple[type[BaseException], ...], trial_timeout_s: float | None = None) -> list[str]:
    """Run every rollout of `todo` once through the nodes of `submit`, at most `slots` at a time
    on each. A call failing means its node cannot run trials (with one of `lost_errors` the node
    is gone; any other failure escaped the node's own trial handling: its proxy died, its disk is
    full), and so does a call not answered within `trial_timeout_s` (a straggler: a hung node):
    the node gets no more work and the rollout goes back in the queue for the others.
    Returns the nodes taken out, in order; when none is left, the error names each one's failure."""
    queue = list(todo)
    alive = dict.fromkeys(submit, slots)  # free slots per node still up
    inflight: dict[asyncio.Future, tuple[str, PlannedRollout]] = {}
    started: dict[asyncio.Future, float] = {}
    why: dict[str, str] = {}
    loop = asyncio.get_running_loop()
    while queue or inflight:
        while queue and any(alive.values()):  # one at a time per node in turn: spread, not fill
            for node in [n for n, free in alive.items() if free > 0][:len(queue)]:
                p = queue.pop(0)
                fut = asyncio.ensure_future(submit[node](p))
                inflight[fut], started[fut] = (node, p), loop.time()
                alive[node] -= 1
        if not inflight:
            raise RayExecutorError(f"every node of the cluster was lost or failed ("
                                   + "; ".join(f"{n}: {w}" for n, w in why.items())
                                   + f"); {len(queue)} rollouts not run: fix or start nodes and run the round "
                                   "again (it resumes)")
        wait = None if trial_timeout_s is None else max(0.0, min(started.values()) + trial_timeout_s - loop.time())
        finished, _ = await asyncio.wait(inflight, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        for fut in [f for f in inflight if f not in finished and trial_timeout_s is not None
                    and loop.time() - started[f] >= trial_timeout_s]:
            fut.cancel()  # the straggler's node is taken out below, like a failed one
            finished.add(fut)
        for fut in finished:
            started.pop(fut, None)
            node, p = inflight.pop(fut)
            try:
                row = fut.result()
            except (Exception, asyncio.CancelledError) as e:  # noqa: BLE001 - the node is taken out, not the round
                if node in alive:
                    kind = ("lost" if isinstance(e, lost_errors) else
                            "stalled" if isinstance(e, asyncio.CancelledError) else "failed")
                    reason = f"no answer within {trial_timeout_s:g} s" if kind == "stalled" else _first_line(e)
                    log.warning("node %s %s (%s): its unfinished trials run on the nodes left", node, kind, reason)
                    del alive[node]
                    why[node] = f"{kind}: {reason}"
                queue.append(p)
                continue
            on_row(row, node)
            if node in alive:
                alive[node] += 1
    return list(why)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1][:300] if text else ''}"


async def ready_nodes(probes: dict[str, Awaitable], timeout_s: float) -> tuple[list[str], dict[str, str]]:
    """The nodes whose actor answered `probes[node]` within `timeout_s` (a node whose CPUs other
    Ray work holds never starts its pinned actor: waiting for it would wait forever), and why each
    other one is left out."""
    futs = {asyncio.ensure_future(probe): node for node, probe in probes.items()}
    done, pending = await asyncio.wait(futs, timeout=timeout_s) if futs else (set(), set())
    for f in pending:
        f.cancel()
    ready, out = [], {futs[f]: f"its actor did not start within {timeout_s:g} s (CPUs held by other work?)"
                      for f in pending}
    for f in done:
        if f.exception() is None:
            ready.append(futs[f])
        else:
            out[futs[f]] = f"its actor failed to start: {_first_line(f.exception())}"
    return sorted(ready), out


class RayExecutor:
    def __init__(self, cfg: RunConfig, policy: str):
        self.cfg, self.policy = cfg, policy

    async def run(self, todo: list[PlannedRollout], job_id: str, on_row: OnRow) -> dict:
        ray = require_ray()
        from ray.exceptions import ActorUnschedulableError, NodeDiedError, RayActorError
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray.init(address=self.cfg.collect.ray_address, log_to_driver=False, configure_logging=False)
        actors = {}
        try:
            nodes = trial_nodes(ray.nodes())
            if not nodes:
                raise RayExecutorError("the Ray cluster has no alive node with a CPU to run trials on")
            log.info("collect on %d Ray nodes: %s", len(nodes), ", ".join(nodes))
            remote = ray.remote(NodeActor)
            cfg = _absolute(self.cfg)
            for name, node_id in nodes.items():
                actors[name] = remote.options(
                    num_cpus=1, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                ).remote(cfg, self.policy, name, os.getcwd())
            ready, unavailable = await ready_nodes({name: a.ready.remote() for name, a in actors.items()},
                                                   self.cfg.collect.ray_ready_timeout_s)
            for name, reason in unavailable.items():
                log.warning("node %s left out of this round: %s", name, reason)
                ray.kill(actors.pop(name))
            if not actors:
                raise RayExecutorError("no node of the Ray cluster could start a trial actor: "
                                       + "; ".join(f"{n}: {w}" for n, w in unavailable.items()))
            submit = {name: _submitter(a, job_id) for name, a in actors.items()}
            lost = await dispatch(submit, self.cfg.collect.concurrency, [_absolute_task(p) for p in todo], on_row,
                                  (RayActorError, NodeDiedError, ActorUnschedulableError),
                                  self.cfg.collect.ray_trial_timeout_s)
            left = {name: a for name, a in actors.items() if name not in lost}
            # A node lost now costs nothing: each closed rollout's shard was published at its close.
            for name, err in zip(left, await asyncio.gather(*(a.finish.remote() for a in left.values()),
                                                            return_exceptions=True)):
                if isinstance(err, Exception):
                    log.warning("node %s: stopping its proxy failed: %s", name, err)
            return {"nodes": sorted(nodes), "lost_nodes": lost, "unavailable_nodes": sorted(unavailable)}
        finally:
            for a in actors.values():
                ray.kill(a)
            ray.shutdown()


def _submitter(actor, job_id: str) -> Submit:
    async def submit(p: PlannedRollout) -> RolloutRow:
        return await actor.trial.remote(p, job_id)
    return submit


def _absolute(cfg: RunConfig) -> RunConfig:
    """Nodes do not share the driver's working directory: paths go to them absolute. A URL goes as
    it is: each node works in its own mirror of it (its WHARF_MIRROR) and uploads its shards."""
    if storage.is_remote(cfg.runs_dir):
        return cfg
    return dataclasses.replace(cfg, runs_dir=str(Path(cfg.runs_dir).resolve()))


def _absolute_task(p: PlannedRollout) -> PlannedRollout:
    return dataclasses.replace(p, task=dataclasses.replace(p.task, path=Path(p.task.path).resolve()))
