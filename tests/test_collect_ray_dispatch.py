"""collect.executor=ray's dispatch (wharf/collect/ray_dispatch.py) in process, each node a coroutine
that answers, fails, hangs, is unavailable for a while or starts late: a node's failure of any
kind takes that node out, never the round, and every trial runs once on the nodes left (the same
scenarios on a real cluster: tests/test_collect_ray.py)."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest


def test_dispatch_requeues_a_lost_nodes_trials_on_the_nodes_left():
    from wharf.collect.ray_dispatch import RayExecutorError, dispatch

    class Lost(Exception):
        pass

    todo = _todo(8)

    def node(name: str, dies_after: int | None):
        calls = []

        async def submit(p):
            calls.append(p)
            await asyncio.sleep(0.01)
            if dies_after is not None and len(calls) > dies_after:
                raise Lost(name)
            return p.task.task_id
        return submit

    lost, ran = _dispatch({"a": node("a", None), "b": node("b", 2)}, 2, todo, (Lost,))
    assert lost == ["b"]
    assert sorted(r for r, _ in ran) == [f"t{i}" for i in range(8)]  # each once
    assert {n for _, n in ran} == {"a", "b"}
    with pytest.raises(RayExecutorError, match="every node of the cluster was lost"):
        asyncio.run(dispatch({"b": node("b", 0)}, 1, todo, lambda *a: None, (Lost,)))


def test_dispatch_takes_out_a_node_that_fails_in_any_way_not_the_round():
    """A node whose proxy died answers every trial with an error its trial handling does not
    catch: before, that error ended the whole round in 0.2 s, the healthy node's trials abandoned."""
    from wharf.collect.proxy_client import ServiceError
    from wharf.collect.ray_dispatch import RayExecutorError, dispatch

    async def proxy_died(p):
        raise ServiceError("proxy at http://10.0.0.2:41000 is not answering")

    todo = _todo(6)
    out, ran = _dispatch({"a": _healthy, "b": proxy_died}, 2, todo, ())
    assert out == ["b"] and sorted(r for r, _ in ran) == [f"t{i}" for i in range(6)] and {n for _, n in ran} == {"a"}
    with pytest.raises(RayExecutorError, match=r"b: failed: ServiceError: proxy at .* is not answering"):
        asyncio.run(dispatch({"b": proxy_died}, 1, todo, lambda *a: None, ()))


def test_a_round_starts_with_the_first_node_up_and_a_late_one_joins_or_is_left_out():
    """collect.ray_ready_timeout_s bounds the wait for the first node only: the others join when
    their actor starts (was: the round waited the whole timeout for each, then dropped them)."""
    from wharf.collect.ray_dispatch import first_ready

    async def scenario(late_after: float | None):
        loop = asyncio.get_running_loop()

        async def up():
            return True

        async def failed():
            raise RuntimeError("no such resource")

        late = loop.create_future()  # a pinned actor whose node's CPUs are taken (for a while)
        if late_after is not None:
            loop.call_later(late_after, late.set_result, True)
        t0 = loop.time()
        ready, out, joining, join_by = await first_ready({"a": up(), "b": late, "c": failed()}, 5)
        waited = loop.time() - t0
        ran: list[tuple[str, str]] = []
        done = await dispatch({"a": _slow, "b": _slow}, 1, _todo(10), lambda r, n: ran.append((r, n)),
                              (), joining=joining, join_by=min(join_by, loop.time() + 0.5))
        return ready, out, waited, done, ran

    from wharf.collect.ray_dispatch import dispatch

    ready, out, waited, done, ran = asyncio.run(scenario(0.05))
    assert ready == ["a"] and waited < 1 and "RuntimeError: no such resource" in out["c"]
    assert done.lost == [] and done.unstarted == {} and {n for _, n in ran} == {"a", "b"}  # b joined
    assert sorted(r for r, _ in ran) == sorted(f"t{i}" for i in range(10))
    ready, out, waited, done, ran = asyncio.run(scenario(None))
    assert {n for _, n in ran} == {"a"} and list(done.unstarted) == ["b"]
    assert "did not start within collect.ray_ready_timeout_s" in done.unstarted["b"]

    async def none_up():
        return await first_ready({"b": asyncio.get_running_loop().create_future()}, 0.2)

    ready, out, joining, _ = asyncio.run(none_up())
    assert ready == [] and joining == {} and "did not start within 0.2 s" in out["b"]


def test_a_task_failing_on_every_node_is_given_up_and_retires_no_node():
    """One task whose trial fails the same way wherever it runs (was: each failure retired its
    node, so 3 failures of one task took out all 3 nodes and the round stopped with 9 of 10 run)."""
    from wharf.collect.ray_dispatch import dispatch

    async def node(p):
        await asyncio.sleep(0.01)
        if p.task.task_id == "t3":
            raise RuntimeError("ShipError: task t3: its archive did not arrive whole")
        return p.task.task_id

    ran: list[tuple[str, str]] = []
    todo = _todo(10) + [PlannedRolloutOf("t3", 1)]
    out = asyncio.run(dispatch({"a": node, "b": node, "c": node}, 1, todo, lambda r, n: ran.append((r, n)), ()))
    assert out.lost == [] and list(out.given_up) == ["t3"] and "succeeded on none" in out.given_up["t3"]
    assert sorted(r for r, _ in ran) == sorted(f"t{i}" for i in range(10) if i != 3)  # each once


def test_a_node_is_retired_when_the_task_it_failed_succeeds_elsewhere():
    """The same task failing on one node and running on another: the node's fault. Its trial runs
    on the other node, never again on the failing one."""
    from wharf.collect.ray_dispatch import dispatch

    tried: list[tuple[str, str]] = []

    def node(name: str, broken: bool):
        async def submit(p):
            tried.append((p.task.task_id, name))
            await asyncio.sleep(0.01)
            if broken:
                raise RuntimeError("NotPublished: the turns could not be published from this node")
            return p.task.task_id
        return submit

    ran: list[tuple[str, str]] = []
    out = asyncio.run(dispatch({"a": node("a", False), "b": node("b", True)}, 1, _todo(2) * 2,
                               lambda r, n: ran.append((r, n)), ()))
    assert out.lost == ["b"] and out.given_up == {}
    assert sorted(r for r, _ in ran) == ["t0", "t0", "t1", "t1"] and {n for _, n in ran} == {"a"}
    assert tried.count(("t1", "b")) == 1  # b's failed task went to a, not back to b


def test_when_no_node_can_publish_the_round_stops_with_no_trial_recorded():
    """Every node's storage refuses (NotPublished on each trial): no row is recorded, so the round
    is not done and its resume runs every trial again (was: each row recorded at its close, its
    turns stranded in the nodes' WALs)."""
    from wharf.collect.node import NotPublished
    from wharf.collect.ray_dispatch import RayExecutorError, dispatch

    async def refused(p):
        await asyncio.sleep(0.01)
        raise NotPublished(f"the turns of rollout {p.task.task_id} could not be published from this node")

    ran: list = []
    with pytest.raises(RayExecutorError, match=r"a: failed: NotPublished: .*two different tasks failed on it"):
        asyncio.run(dispatch({"a": refused, "b": refused}, 1, _todo(4), lambda r, n: ran.append(r), ()))
    assert ran == []

def test_a_round_smaller_than_one_nodes_slots_is_spread_over_the_nodes_that_start_with_it():
    """3 nodes, 6 trials, 8 slots a node, two nodes' actors up a moment after the first (was: the
    first node up took all 6 before the others joined)."""
    from wharf.collect.ray_dispatch import dispatch

    async def scenario():
        loop = asyncio.get_running_loop()
        joining = {n: loop.create_future() for n in ("b", "c")}
        for i, fut in enumerate(joining.values()):
            loop.call_later(0.05 * (i + 1), fut.set_result, True)
        async def trial(p):  # longer than the nodes take to start
            await asyncio.sleep(0.5)
            return p.task.task_id

        ran: list[tuple[str, str]] = []
        await dispatch({n: trial for n in "abc"}, 8, _todo(6), lambda r, n: ran.append((r, n)), (),
                       joining=joining, join_by=loop.time() + 5)
        return ran

    ran = asyncio.run(scenario())
    assert sorted(r for r, _ in ran) == [f"t{i}" for i in range(6)]
    assert sorted(n for _, n in ran) == ["a", "a", "b", "b", "c", "c"]


def PlannedRolloutOf(task: str, attempt: int):
    from wharf.collect.tasksets import PlannedRollout, Task

    return PlannedRollout(Task(task, Path(".")), attempt)


async def _slow(p):
    await asyncio.sleep(0.05)
    return p.task.task_id


def test_dispatch_takes_out_a_node_that_stops_answering(caplog):
    """A straggler bound (collect.ray_trial_timeout_s): a hung node's trials run on the others, and
    the node is named as stalled (was: "failed (InvalidStateError: Result is not set.)", the
    cancelled call read before it had ended)."""
    async def hung(p):
        await asyncio.Event().wait()

    out, ran = _dispatch({"a": _healthy, "b": hung}, 1, _todo(4), (), 0.3)
    assert out == ["b"] and sorted(r for r, _ in ran) == [f"t{i}" for i in range(4)] and {n for _, n in ran} == {"a"}
    assert "node b stalled (no answer within 0.3 s)" in caplog.text


class Unavailable(Exception):
    """Stands for Ray's ActorUnavailableError: the actor is there but did not answer this call."""


def test_dispatch_rests_a_node_that_is_merely_unavailable_and_uses_it_again():
    """Before, any actor error took the node out for good; an unavailable one now rests it."""
    misses = []

    async def flaky(p):  # unavailable twice, then fine
        if len(misses) < 2:
            misses.append(p.task.task_id)
            raise Unavailable("actor unavailable: connection reset")
        return await _healthy(p)

    out, ran = _dispatch({"a": _healthy, "b": flaky}, 1, _todo(16), (Unavailable,), None, (Unavailable,), 0.01)
    assert out == [] and len(misses) == 2 and sorted(r for r, _ in ran) == sorted(f"t{i}" for i in range(16))

    assert sum(n == "b" for _, n in ran) >= 1  # b came back and ran trials after resting

    async def gone(p):
        raise Unavailable("actor unavailable: node unreachable")

    out, ran = _dispatch({"a": _healthy, "b": gone}, 1, _todo(8), (Unavailable,), None, (Unavailable,), 0.01)
    assert out == ["b"] and {n for _, n in ran} == {"a"} and len(ran) == 8  # 4 in a row: out
    # still resting when the work is done: named too (a raylet that dies answers 'unavailable' first)
    out, ran = _dispatch({"a": _healthy, "b": gone}, 1, _todo(2), (Unavailable,), None, (Unavailable,), 5)
    assert out == ["b"] and {n for _, n in ran} == {"a"}


def _todo(n: int) -> list:
    from wharf.collect.tasksets import PlannedRollout, Task

    return [PlannedRollout(Task(f"t{i}", Path(".")), 0) for i in range(n)]


async def _healthy(p):
    await asyncio.sleep(0.01)
    return p.task.task_id


def _dispatch(submit: dict, slots: int, todo: list, *args) -> tuple[list[str], list[tuple[str, str]]]:
    """dispatch(...) over `submit`; (the nodes taken out mid-round, [(row, node)] recorded)."""
    from wharf.collect.ray_dispatch import dispatch

    ran: list[tuple[str, str]] = []
    return asyncio.run(dispatch(submit, slots, todo, lambda row, n: ran.append((row, n)), *args)).lost, ran
