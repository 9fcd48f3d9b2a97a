"""collect.executor=ray: a round's trials spread over the nodes of a Ray cluster.

Each node with a CPU to give gets one actor, pinned to it, that runs its own recording proxy and
its own harbor trials (wharf/collect/node.py) and writes its shards into the round's turns dir. The
driver hands each node up to collect.concurrency trials at a time (no more than its share of the
work left) and records each row as it comes back, exactly as the local executor does; a node
returns a row only once the rollout's turns are in the run's storage. The round starts as soon as one node's actor
is up; a node whose actor starts later joins it, and one not started within
collect.ray_ready_timeout_s is left out of the round and named. A node lost mid-round (its actor
dies with it), or failing in a way its own trial handling does not catch (its proxy died): the
trials it had not returned run again on the nodes left, under fresh rollout ids, so turns of
the abandoned tries stay orphans that convert ignores (the resume rules of wharf/collect/runner.py).
A node that is merely unavailable (its actor did not answer one call) rests and comes back.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import tomllib
from pathlib import Path

from wharf.collect.node import NodeTrials, OnRow, node_proxy
from wharf.collect.ray_dispatch import RayExecutorError, Submit, dispatch, first_ready
from wharf.collect.records import RolloutRow
from wharf.collect.ship import TaskCache, pack
from wharf.collect.tasksets import PlannedRollout
from wharf.core import storage
from wharf.core.config import RunConfig
from wharf.core.config_stages import CollectConfig

log = logging.getLogger("wharf.collect")


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
        if not storage.is_remote(cfg.runs_dir) and not paths.root.is_dir():
            raise RayExecutorError(f"node {node} does not see the run dir {paths.root} (the driver made it): it "
                                   "shares no filesystem with the driver; put the run in object storage "
                                   "(runs_dir=s3://bucket/prefix), or runs_dir on a filesystem every node mounts")
        self.tasks = TaskCache()  # the round's task dirs, as the driver shipped them
        self.node = NodeTrials(cfg, policy, paths.proxy_config.with_name(f"proxy-{node}.yaml"),
                               paths.logs / f"proxy-{node}.log")
        self._up: asyncio.Future | None = None
        self._unpushed: list = []  # trial dirs whose upload failed: retried at finish

    def ready(self) -> bool:
        """Answers once the actor runs on its node (the driver's readiness probe)."""
        return True

    async def trial(self, p: PlannedRollout, job_id: str, digest: str, archive: list) -> RolloutRow:
        """`archive`: [ObjectRef of the task dir's tar] (in a list, so that Ray hands over the ref and
        the node fetches the archive only the first time it sees `digest`)."""
        data = None if self.tasks.has(digest) else await archive[0]
        p = dataclasses.replace(p, task=dataclasses.replace(p.task, path=self.tasks.dir(digest, p.task.task_id, data)))
        if self._up is None:  # the proxy starts with the first trial, on the actor's event loop
            self._up = asyncio.ensure_future(self.node.__aenter__())
        await asyncio.shield(self._up)
        row = await self.node.trial(p, job_id)
        await self.node.publish(row.rollout_id)  # rows left only in this node's WAL would be stranded here
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


# Beyond the agent's and the verifier's own timeouts, what a trial may take: its sandbox's start
# (bounded at 300 s), setup and uploads on a loaded node.
TRIAL_SLACK_S = 600.0


def trial_timeout_s(cc: CollectConfig, task_dirs: list[Path]) -> float:
    """collect.ray_trial_timeout_s, else a bound no healthy trial reaches: the agent's timeout
    (collect.agent_timeout_s, else the longest [agent] timeout_sec of the round's tasks, else an
    hour) plus the verifier's (likewise, else harbor's 600 s) plus TRIAL_SLACK_S."""
    if cc.ray_trial_timeout_s is not None:
        return cc.ray_trial_timeout_s
    agent = cc.agent_timeout_s or _longest(task_dirs, "agent") or 3600.0
    verifier = cc.verifier_timeout_s or _longest(task_dirs, "verifier") or 600.0
    return agent + verifier + TRIAL_SLACK_S


def _longest(task_dirs: list[Path], section: str) -> float | None:
    """The longest `[section] timeout_sec` of the tasks' task.toml (None: none says)."""
    found = []
    for d in task_dirs:
        try:
            found.append(tomllib.loads((Path(d) / "task.toml").read_text()).get(section, {}).get("timeout_sec"))
        except (OSError, tomllib.TOMLDecodeError):
            continue  # discover() checked the task dirs: a dir read badly here only loses its say
    return max((float(t) for t in found if t), default=None)


def trial_nodes(nodes: list[dict]) -> dict[str, str]:
    """{name: Ray node id} of the alive nodes that have a CPU for a node actor."""
    return {n["NodeID"][:12]: n["NodeID"] for n in nodes
            if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= 1}


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
            ready, unavailable, joining, join_by = await first_ready(
                {name: a.ready.remote() for name, a in actors.items()}, self.cfg.collect.ray_ready_timeout_s)
            self._leave_out(ray, actors, unavailable)
            if not actors:
                raise RayExecutorError("no node of the Ray cluster could start a trial actor: "
                                       + "; ".join(f"{n}: {w}" for n, w in unavailable.items()))
            shipped = _ship(ray, todo)
            submit = {name: _submitter(a, job_id, shipped) for name, a in actors.items()}
            bound = trial_timeout_s(self.cfg.collect, sorted({p.task.path for p in todo}))
            log.info("a node whose trial has not answered within %g s counts as hung", bound)
            out = await dispatch(submit, self.cfg.collect.concurrency, todo, on_row,
                                 (RayActorError, NodeDiedError, ActorUnschedulableError),
                                 bound, (ActorUnavailableError,), joining=joining, join_by=join_by)
            lost = out.lost
            self._leave_out(ray, actors, out.unstarted)
            unavailable.update(out.unstarted)
            left = {name: a for name, a in actors.items() if name not in lost}
            # A node lost now costs nothing: each trial returned only once its rows were published.
            for name, err in zip(left, await asyncio.gather(*(a.finish.remote() for a in left.values()),
                                                            return_exceptions=True)):
                if isinstance(err, Exception):
                    log.warning("node %s: stopping its proxy failed: %s", name, err)
            return {"nodes": sorted(nodes), "lost_nodes": lost, "unavailable_nodes": sorted(unavailable),
                    "given_up_tasks": out.given_up}
        finally:
            for a in actors.values():
                ray.kill(a)
            ray.shutdown()


    @staticmethod
    def _leave_out(ray, actors: dict, unstarted: dict[str, str]) -> None:
        for name, reason in unstarted.items():
            log.warning("node %s left out of this round: %s", name, reason)
            ray.kill(actors.pop(name))


def _ship(ray, todo: list[PlannedRollout]) -> dict:
    """{task dir: (digest, [ref])}: each task dir packed once into Ray's object store (a node
    fetches an archive the first time it runs that task: no path is shared with the nodes)."""
    shipped = {}
    for p in todo:
        if p.task.path not in shipped:
            digest, data = pack(Path(p.task.path))
            shipped[p.task.path] = (digest, [ray.put(data)])
    return shipped


def _submitter(actor, job_id: str, shipped: dict) -> Submit:
    async def submit(p: PlannedRollout) -> RolloutRow:
        return await actor.trial.remote(p, job_id, *shipped[p.task.path])
    return submit


def _absolute(cfg: RunConfig) -> RunConfig:
    """Nodes do not share the driver's working directory: a local run dir goes to them absolute
    (it must be on a filesystem they mount: NodeActor checks). A URL goes as it is: each node works
    in its own mirror of it (its WHARF_MIRROR) and uploads its shards and trial logs."""
    if storage.is_remote(cfg.runs_dir):
        return cfg
    return dataclasses.replace(cfg, runs_dir=str(Path(cfg.runs_dir).resolve()))
