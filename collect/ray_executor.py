"""collect.executor=ray: a round's trials spread over the nodes of a Ray cluster.

Each node with a CPU to give gets one actor, pinned to it, that runs its own recording proxy and
its own harbor trials (collect/node.py) and writes its shards into the round's turns dir. The
driver hands each node up to collect.concurrency trials at a time and records each row as it
comes back, exactly as the local executor does. A node whose actor does not start within
collect.ray_ready_timeout_s is left out of the round and named. A node lost mid-round (its actor
dies with it), or failing in a way its own trial handling does not catch (its proxy died): the
trials it had not returned run again on the nodes left, under fresh rollout ids, so turns of
the abandoned tries stay orphans that convert ignores (the resume rules of collect/runner.py).
A node that is merely unavailable (its actor did not answer one call) rests and comes back.
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


class _Nodes:
    """The dispatch loop's view of the nodes: free slots, rests after an unavailable answer, the
    calls in flight (with their start times, for the straggler bound) and why a node was taken out."""

    def __init__(self, submit: dict[str, Submit], slots: int, timeout_s: float | None, rest_s: float):
        self.submit, self.timeout_s, self.rest_s = submit, timeout_s, rest_s
        self.free = dict.fromkeys(submit, slots)  # free slots per node still in the round
        self.strikes = dict.fromkeys(submit, 0)  # unavailable answers in a row
        self.back_at: dict[str, float] = {}  # a resting node takes work again from then
        self.inflight: dict[asyncio.Future, tuple[str, PlannedRollout, float]] = {}
        self.why: dict[str, str] = {}
        self.loop = asyncio.get_running_loop()

    def start(self, queue: list[PlannedRollout]) -> None:
        """Hand out work, one at a time per node in turn (spread, not fill)."""
        while queue:
            now = self.loop.time()
            self.back_at = {n: t for n, t in self.back_at.items() if t > now and n in self.free}
            nodes = [n for n, f in self.free.items() if f > 0 and n not in self.back_at][:len(queue)]
            if not nodes:
                return
            for node in nodes:
                p = queue.pop(0)
                self.inflight[asyncio.ensure_future(self.submit[node](p))] = (node, p, now)
                self.free[node] -= 1

    async def finished(self) -> list[tuple[asyncio.Future, str, PlannedRollout]]:
        """The calls that ended next, and those past the straggler bound (cancelled); none when a
        resting node is due back first."""
        due = [t for t in self.back_at.values()]
        if self.timeout_s is not None:
            due += [t0 + self.timeout_s for _, _, t0 in self.inflight.values()]
        wait = max(0.0, min(due) - self.loop.time()) if due else None
        if not self.inflight:
            await asyncio.sleep(wait or 0)
            return []
        done, _ = await asyncio.wait(self.inflight, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        now = self.loop.time()
        for fut, (_, _, t0) in self.inflight.items():
            if fut not in done and self.timeout_s is not None and now - t0 >= self.timeout_s:
                fut.cancel()  # the straggler's node is taken out, like a failed one
                done.add(fut)
        return [(fut, *self.inflight.pop(fut)[:2]) for fut in done]

    def ok(self, node: str) -> None:
        if node in self.free:
            self.free[node] += 1
            self.strikes[node] = 0

    def failed(self, node: str, e: BaseException, lost: tuple, unavailable: tuple, max_strikes: int) -> None:
        if node not in self.free:
            return  # taken out already
        if isinstance(e, unavailable) and self.strikes[node] < max_strikes:
            self.strikes[node] += 1
            self.free[node] += 1
            self.back_at[node] = self.loop.time() + self.rest_s * self.strikes[node]
            log.warning("node %s unavailable (%s): its trial runs again; the node rests %g s", node,
                        _first_line(e), self.rest_s * self.strikes[node])
            return
        kind = ("unavailable" if isinstance(e, unavailable) else "lost" if isinstance(e, lost) else
                "stalled" if isinstance(e, asyncio.CancelledError) else "failed")
        reason = (f"no answer within {self.timeout_s:g} s" if kind == "stalled" else
                  f"{max_strikes + 1} times in a row: {_first_line(e)}" if kind == "unavailable" else _first_line(e))
        log.warning("node %s %s (%s): its unfinished trials run on the nodes left", node, kind, reason)
        del self.free[node]
        self.why[node] = f"{kind}: {reason}"

    def resting(self) -> bool:
        return any(n in self.free for n in self.back_at)


async def dispatch(submit: dict[str, Submit], slots: int, todo: list[PlannedRollout], on_row: OnRow,
                   lost_errors: tuple[type[BaseException], ...], trial_timeout_s: float | None = None,
                   unavailable_errors: tuple[type[BaseException], ...] = (), rest_s: float = 2.0,
                   max_strikes: int = 3) -> list[str]:
    """Run every rollout of `todo` once through the nodes of `submit`, at most `slots` at a time
    on each. A call failing means its node cannot run trials (with one of `lost_errors` the node
    is gone; any other failure escaped the node's own trial handling: its proxy died, its disk is
    full), and so does a call not answered within `trial_timeout_s` (a straggler: a hung node):
    the node gets no more work and the rollout goes back in the queue for the others. One of
    `unavailable_errors` (the node is there but did not answer this time) puts the rollout back
    and rests the node (rest_s, longer each time) instead; only `max_strikes` + 1 of them in a row
    take it out. Returns the nodes taken out, in order; when none is left, the error names each
    one's failure."""
    queue = list(todo)
    nodes = _Nodes(submit, slots, trial_timeout_s, rest_s)
    while queue or nodes.inflight:
        nodes.start(queue)
        if not nodes.inflight and not nodes.resting():
            raise RayExecutorError(f"every node of the cluster was lost or failed ("
                                   + "; ".join(f"{n}: {w}" for n, w in nodes.why.items())
                                   + f"); {len(queue)} rollouts not run: fix or start nodes and run the round "
                                   "again (it resumes)")
        for fut, node, p in await nodes.finished():
            try:
                row = fut.result()
            except (Exception, asyncio.CancelledError) as e:  # noqa: BLE001 - the node is taken out, not the round
                queue.append(p)
                nodes.failed(node, e, lost_errors, unavailable_errors, max_strikes)
                continue
            on_row(row, node)
            nodes.ok(node)
    return list(nodes.why)


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
        from ray.exceptions import ActorUnavailableError, ActorUnschedulableError, NodeDiedError, RayActorError
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
                                  self.cfg.collect.ray_trial_timeout_s, (ActorUnavailableError,))
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
