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
