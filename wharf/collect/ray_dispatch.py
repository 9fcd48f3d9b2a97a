"""The driver's side of collect.executor=ray that needs no Ray: handing trials to nodes
(`dispatch`: spread within each node's share, requeue a failed trial on another node, retire a
node only when the failure is its own and not its task's (ray_blame.py), rest an unavailable
node, a straggler bound)
and the readiness probe of their actors (`first_ready`; late nodes join in `dispatch`). Pure asyncio over `submit` callables,
so it is tested without a cluster; wharf/collect/ray_executor.py wires it to Ray's actors."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from wharf.collect.node import OnRow
from wharf.collect.ray_blame import Blame
from wharf.collect.records import RolloutRow
from wharf.collect.tasksets import PlannedRollout
from wharf.core.errors import WharfError

log = logging.getLogger("wharf.collect")


class RayExecutorError(WharfError, RuntimeError):
    """The Ray cluster could not run the round (not installed, no node to run on, all nodes lost)."""


Submit = Callable[[PlannedRollout], Awaitable[RolloutRow]]


class _Nodes:
    """The dispatch loop's view of the nodes: free slots, rests after an unavailable answer, the
    calls in flight (with their start times, for the straggler bound) and why a node was taken out."""

    def __init__(self, submit: dict[str, Submit], slots: int, timeout_s: float | None, rest_s: float,
                 joining: dict[str, asyncio.Future], join_by: float, spread_s: float):
        self.submit, self.slots, self.timeout_s, self.rest_s = submit, slots, timeout_s, rest_s
        self.joining = {fut: node for node, fut in joining.items()}  # actors still starting
        self.join_by = join_by  # loop time after which a node still starting is left out
        self.loop = asyncio.get_running_loop()
        self.spread_by = self.loop.time() + spread_s  # until then a node still starting counts in the share
        self.blame = Blame()
        self.failures: dict[tuple[str, str], tuple[str, str]] = {}  # (node, task) -> how it first failed there
        self.unstarted: dict[str, str] = {}
        self.free = {n: slots for n in submit if n not in joining}  # free slots per node in the round
        self.strikes = dict.fromkeys(submit, 0)  # unavailable answers in a row
        self.missed: dict[str, str] = {}  # the last unavailable answer of each node
        self.back_at: dict[str, float] = {}  # a resting node takes work again from then
        self.inflight: dict[asyncio.Future, tuple[str, PlannedRollout, float]] = {}
        self.why: dict[str, str] = {}

    def start(self, queue: list[PlannedRollout]) -> None:
        """Hand out work to the least loaded node that may run it, each node at most its share of
        the work left (so a round smaller than one node's slots is spread, not filled into the first
        node up); a trial never goes to a node its task failed on."""
        now = self.loop.time()
        self.back_at = {n: t for n, t in self.back_at.items() if t > now and n in self.free}
        cap = min(self.slots, -(-(len(queue) + len(self.inflight)) // max(1, self._sharing(now))))
        for p in list(queue):
            load = {n: self.slots - f for n, f in self.free.items()
                    if f > 0 and n not in self.back_at and self.slots - f < cap
                    and self.blame.may_run(p.task.task_id, n)}
            if load:
                node = min(load, key=load.get)
                queue.remove(p)
                self.inflight[asyncio.ensure_future(self.submit[node](p))] = (node, p, now)
                self.free[node] -= 1

    def _sharing(self, now: float) -> int:
        """The nodes the work is shared among: those in the round, and for a moment (spread_s) those still starting."""
        return len(self.free) + (len(self.joining) if now < self.spread_by else 0)

    def stuck(self, queue: list[PlannedRollout]) -> list[PlannedRollout]:
        """Queued trials no node left may run (their task failed on every one): given up."""
        live = set(self.free)
        if self.joining or not live:
            return []  # a node may still join; with none left the round stops, naming why
        out = [p for p in queue if not any(self.blame.may_run(p.task.task_id, n) for n in live)]
        for p in out:
            self.blame.given_up.setdefault(p.task.task_id, f"failed on every node left ({', '.join(sorted(live))})")
        return out

    async def finished(self) -> list[tuple[asyncio.Future, str, PlannedRollout]]:
        """The calls that ended next, and those past the straggler bound (cancelled); none when a
        resting node is due back first."""
        now = self.loop.time()
        due = [t for t in self.back_at.values()] + ([self.join_by] if self.joining else [])
        due += [self.spread_by] if self.joining and now < self.spread_by else []
        if self.timeout_s is not None:
            due += [t0 + self.timeout_s for _, _, t0 in self.inflight.values()]
        wait = max(0.0, min(due) - self.loop.time()) if due else None
        if not self.inflight and not self.joining:
            await asyncio.sleep(wait or 0)
            return []
        done, _ = await asyncio.wait([*self.inflight, *self.joining], timeout=wait,
                                     return_when=asyncio.FIRST_COMPLETED)
        self._joined([f for f in done if f in self.joining])
        now = self.loop.time()
        stalled = [fut for fut, (_, _, t0) in self.inflight.items()
                   if fut not in done and self.timeout_s is not None and now - t0 >= self.timeout_s]
        for fut in stalled:
            fut.cancel()  # the straggler's node is taken out, like a failed one
        if stalled:  # a cancelled call ends on a later turn of the loop: its result is then the cancellation
            await asyncio.wait(stalled, timeout=5)
        done.update(stalled)
        return [(fut, *self.inflight.pop(fut)[:2]) for fut in done if fut in self.inflight]

    def _joined(self, started: list[asyncio.Future]) -> None:
        """Nodes whose actor started late join the round; past join_by, the rest are left out."""
        for fut in started:
            node = self.joining.pop(fut)
            if fut.exception() is None:
                log.info("node %s started late: it joins the round", node)
                self.free[node] = self.slots
            else:
                self.unstarted[node] = f"its actor failed to start: {_first_line(fut.exception())}"
        if self.loop.time() >= self.join_by:
            self.leave_out("did not start within collect.ray_ready_timeout_s (CPUs held by other work?)")

    def leave_out(self, why: str) -> None:
        for fut, node in self.joining.items():
            fut.cancel()
            self.unstarted[node] = f"its actor {why}"
        self.joining.clear()

    def ok(self, node: str, task: str) -> None:
        if node in self.free:
            self.free[node] += 1
            self.strikes[node] = 0
        for other, why in self.blame.success(task, node).items():
            kind, reason = self.failures[(other, task)]
            self._retire(other, kind, reason, why)

    def failed(self, node: str, task: str, e: BaseException, lost: tuple, unavailable: tuple,
               max_strikes: int) -> None:
        """A call to `node` for a trial of `task` failed: rest the node, retire it, or (when the
        failure may be the task's: wharf/collect/ray_blame.py) keep it and run the trial elsewhere."""
        if node not in self.free:
            return  # taken out already
        if isinstance(e, unavailable) and self.strikes[node] < max_strikes:
            self.strikes[node] += 1
            self.missed[node] = _first_line(e)
            self.free[node] += 1
            self.back_at[node] = self.loop.time() + self.rest_s * self.strikes[node]
            log.warning("node %s unavailable (%s): its trial runs again; the node rests %g s", node,
                        _first_line(e), self.rest_s * self.strikes[node])
            return
        kind = ("unavailable" if isinstance(e, unavailable) else "lost" if isinstance(e, lost) else
                "stalled" if isinstance(e, asyncio.CancelledError) else "failed")
        reason = (f"no answer within {self.timeout_s:g} s" if kind == "stalled" else
                  f"{max_strikes + 1} times in a row: {_first_line(e)}" if kind == "unavailable" else _first_line(e))
        if kind in ("lost", "unavailable"):
            self._retire(node, kind, reason)
            return
        self.free[node] += 1
        self.failures.setdefault((node, task), (kind, reason))
        blamed = self.blame.failure(task, node)
        if blamed is None:
            log.warning("node %s: a trial of %s %s (%s): it runs again on another node", node, task, kind, reason)
        else:
            self._retire(node, kind, reason, blamed)

    def _retire(self, node: str, kind: str, reason: str, blamed: str = "") -> None:
        if node not in self.free:
            return
        log.warning("node %s %s (%s)%s: its unfinished trials run on the nodes left", node, kind, reason,
                    f", retired: {blamed}" if blamed else "")
        del self.free[node]
        self.why[node] = f"{kind}: {reason}" + (f"; {blamed}" if blamed else "")

    def resting(self) -> bool:
        return any(n in self.free for n in self.back_at)

    def unanswered(self) -> None:
        """At the end: a node whose last answer was 'unavailable' is named with the lost ones (a
        raylet that dies answers so first; the round may end before it is tried again)."""
        for node in [n for n in self.free if self.strikes[n]]:
            del self.free[node]
            self.why[node] = f"unavailable: {self.missed[node]}; not tried again before the round ended"


@dataclass
class Dispatched:
    lost: list[str]  # the nodes taken out mid-round, in order (why: in the log)
    unstarted: dict[str, str]  # the nodes whose actor never started, and why
    given_up: dict[str, str] = field(default_factory=dict)  # tasks whose trials failed wherever they ran, and why


async def dispatch(submit: dict[str, Submit], slots: int, todo: list[PlannedRollout], on_row: OnRow,
                   lost_errors: tuple[type[BaseException], ...], trial_timeout_s: float | None = None,
                   unavailable_errors: tuple[type[BaseException], ...] = (), rest_s: float = 2.0,
                   max_strikes: int = 3, joining: dict[str, asyncio.Future] | None = None,
                   join_by: float = 0.0, spread_s: float = 10.0) -> Dispatched:
    """Run every rollout of `todo` once through the nodes of `submit`, at most `slots` at a time
    on each. A call failing means its node cannot run trials (with one of `lost_errors` the node
    is gone; any other failure escaped the node's own trial handling: its proxy died, its disk is
    full), and so does a call not answered within `trial_timeout_s` (a straggler: a hung node):
    the node gets no more work and the rollout goes back in the queue for the others. One of
    `unavailable_errors` (the node is there but did not answer this time) puts the rollout back
    and rests the node (rest_s, longer each time) instead; only `max_strikes` + 1 of them in a row
    take it out. `joining`: {node: its actor's readiness} of nodes still starting: each joins the
    round when it answers, until loop time `join_by`; for its first `spread_s` seconds it counts
    in each node's share of the work. A failure that may be its task's, not its node's, keeps the
    node (wharf/collect/ray_blame.py); a task that failed wherever it ran is given up, its trials
    not run (run the round again to retry them). When no node is left, the error names each one's failure."""
    queue = list(todo)
    nodes = _Nodes(submit, slots, trial_timeout_s, rest_s, joining or {}, join_by, spread_s)
    while queue or nodes.inflight:
        nodes.start(queue)
        for p in nodes.stuck(queue):
            queue.remove(p)
        if not queue and not nodes.inflight:
            break
        if not nodes.inflight and not nodes.resting() and not nodes.joining:
            raise RayExecutorError("every node of the cluster was lost or failed ("
                                   + "; ".join(f"{n}: {w}" for n, w in nodes.why.items())
                                   + f"); {len(queue)} rollouts not run: fix or start nodes and run the round "
                                   "again (it resumes)")
        for fut, node, p in await nodes.finished():
            try:
                row = fut.result()
            except (Exception, asyncio.CancelledError) as e:  # noqa: BLE001 - the node is taken out, not the round
                nodes.failed(node, p.task.task_id, e, lost_errors, unavailable_errors, max_strikes)
                _requeue(queue, p, nodes)
                continue
            on_row(row, node)
            nodes.ok(node, p.task.task_id)
    nodes.leave_out("had not started when the round's trials were done")
    nodes.unanswered()
    return Dispatched(list(nodes.why), nodes.unstarted, dict(nodes.blame.given_up))


def _requeue(queue: list[PlannedRollout], p: PlannedRollout, nodes: _Nodes) -> None:
    """`p` back in the queue, unless its task is given up now (then its queued trials go too)."""
    task = p.task.task_id
    why = nodes.blame.give_up(task, set(nodes.free))
    if why is None:
        queue.append(p)
        return
    left = [q for q in queue if q.task.task_id == task]
    for q in left:
        queue.remove(q)
    log.warning("task %s %s: its %d trials left are not run this round (run it again once the task is fixed)",
                task, why, len(left) + 1)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1][:300] if text else ''}"


async def first_ready(probes: dict[str, Awaitable], timeout_s: float
                      ) -> tuple[list[str], dict[str, str], dict[str, asyncio.Future], float]:
    """Wait until some node's actor answers `probes[node]` (a node whose CPUs other Ray work holds
    never starts its pinned actor: the round does not wait for every node), at most `timeout_s`.
    Returns the nodes ready, why others failed to start, the probes still pending (they may join
    later, see dispatch) and the loop time the wait ends by (a pending node's deadline)."""
    loop = asyncio.get_running_loop()
    join_by = loop.time() + timeout_s
    futs = {asyncio.ensure_future(probe): node for node, probe in probes.items()}
    pending, ready, out = set(futs), [], {}
    while pending and not ready:
        done, pending = await asyncio.wait(pending, timeout=max(0.0, join_by - loop.time()),
                                           return_when=asyncio.FIRST_COMPLETED)
        if not done:
            break
        for f in done:
            if f.exception() is None:
                ready.append(futs[f])
            else:
                out[futs[f]] = f"its actor failed to start: {_first_line(f.exception())}"
    if not ready:
        for f in pending:
            f.cancel()
            out[futs[f]] = f"its actor did not start within {timeout_s:g} s (CPUs held by other work?)"
        pending = set()
    return sorted(ready), out, {futs[f]: f for f in pending}, join_by
