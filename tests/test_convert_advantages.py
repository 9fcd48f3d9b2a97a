"""convert.advantages against hand-computed values; convert.build's choice of who enters a group."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from wharf.convert.advantages import advantages_by_group, group_advantages
from wharf.convert.build import build
from wharf.convert.reader import Job
from wharf.convert.rows import Call, RowOptions


def test_grpo_by_hand():
    # rewards 1, 0, 0, 1: mean 0.5, sample std sqrt(1/3) = 0.57735
    adv, why = group_advantages([1, 0, 0, 1], "grpo", eps=0.0)
    assert why is None
    np.testing.assert_allclose(adv, [0.866025, -0.866025, -0.866025, 0.866025], atol=1e-6)
    # 1, 0, 0: mean 1/3, sample std sqrt(1/3)
    adv, _ = group_advantages([1, 0, 0], "grpo", eps=0.0)
    np.testing.assert_allclose(adv, [1.154701, -0.577350, -0.577350], atol=1e-6)


def test_dr_grpo_and_rloo_by_hand():
    adv, _ = group_advantages([1, 0, 0], "dr_grpo")
    np.testing.assert_allclose(adv, [2 / 3, -1 / 3, -1 / 3])
    # leave-one-out: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5
    adv, _ = group_advantages([1, 0, 0], "rloo")
    np.testing.assert_allclose(adv, [1.0, -0.5, -0.5])
    adv, _ = group_advantages([0.5, 1.0], "rloo")
    np.testing.assert_allclose(adv, [-0.5, 0.5])


def test_groups_without_signal_are_dropped_and_zero_keeps_the_rest():
    kept, dropped = advantages_by_group({"a": [1, 1, 1], "b": [0.0], "c": [0, 1], "d": [0, 0]}, "grpo")
    assert set(kept) == {"c"} and dropped == {"a": "all_equal", "b": "one_member", "d": "all_equal"}
    zk, zd = advantages_by_group({"a": [1, 1, 1], "b": [0.0], "c": [0, 1]}, "zero")
    assert set(zk) == {"c"} and zd == {"a": "all_equal", "b": "one_member"}  # the same groups as grpo
    assert zk["c"].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="convert.advantage: 'ppo' is not one of"):
        group_advantages([0, 1], "ppo")


def _call(turn, prompt, completion):
    return Call(turn, np.array(prompt, np.int32), np.array(completion, np.int32),
                np.full(len(completion), -0.1, np.float32))


def _job(rollouts):
    """rollouts: (rollout_id, group, reward, status, calls)"""
    job = Job(Path("/jobs/j1"), "j1", "agent-x", [])
    for rid, group, reward, status, calls in rollouts:
        job.rollouts.append({"rollout_id": rid, "group_id": group, "task_id": group, "reward": reward,
                             "status": status})
        if calls:
            job.calls[rid] = (0, calls)
    job.files = ["/jobs/j1/turns/part-0.parquet"]
    return job


def test_failures_the_policy_did_not_cause_are_left_out():
    one = [_call(0, [1, 2], [3])]
    split = [_call(0, [1, 2], [3]), _call(1, [9, 2, 3, 4], [5])]  # a prefix break: 2 rows
    job = _job([
        ("a", "g", 1.0, "ok", split), ("b", "g", 0.0, "agent_timeout", one), ("c", "g", None, "agent_error", one),
        ("d", "g", 1.0, "infra_error", one), ("e", "g", 0.0, "verifier_error", one),
        ("f", "h", 1.0, "ok", one),  # one-member group once infra failures are out
        ("i", "h", None, "infra_error", one),
        ("k", "m", 0.0, "context_exceeded", one), ("l", "m", 1.0, "ok", []),  # no turns: out of the group
    ])
    out = build([job], RowOptions(), "rloo", null_reward=0.0)
    assert out.groups == ["j1/g"]
    assert {r["rollout_id"]: r["advantage"] for r in out.rollouts} == {"a": 1.0, "b": -0.5, "c": -0.5}
    assert out.stats["rollouts"]["left_out"] == {"infra_error": 2, "verifier_error": 1, "group_one_member": 2,
                                                 "no_turns": 1}
    assert out.stats["groups"] == {"used": 1, "dropped": {"one_member": 2}}
    # a rollout split into two rows counts once: each row weighs its share of the rollout's tokens
    # (1 and 1 completion tokens here)
    assert [(out.rollouts[i]["rollout_id"], w) for i, w in zip(out.rollout_index, out.weights)] == \
        [("a", 0.5), ("a", 0.5), ("b", 1.0), ("c", 1.0)]
    assert out.stats["prefix_breaks"]["by_agent"]["agent-x"]["breaks"] == 1
    # without a null_reward an agent_error without reward is left out instead
    out = build([job], RowOptions(), "rloo", null_reward=None)
    assert {r["rollout_id"]: r["advantage"] for r in out.rollouts} == {"a": 1.0, "b": -1.0}


def test_context_exceeded_and_length_cut_completions_are_masked_and_counted():
    cut = Call(0, np.array([1, 2], np.int32), np.array([8, 9], np.int32), np.full(2, -0.1, np.float32), "length")
    job = _job([("a", "g", 1.0, "ok", [_call(0, [1, 2], [3, 4])]),
                ("b", "g", 0.0, "context_exceeded", [_call(0, [1, 2], [5, 6, 7])]),
                ("c", "g", 0.0, "ok", [cut, _call(1, [1, 2, 8, 9, 10], [11])])])
    out = build([job], RowOptions(), "rloo")  # the defaults: both masked
    # b's reward still counts in the group (rloo: a = 1 - 0, c = 0 - (1 + 0) / 2), its tokens are not trained
    assert {r["rollout_id"]: r["advantage"] for r in out.rollouts} == {"a": 1.0, "c": -0.5}
    assert [r.trainable for r in out.rows] == [2, 1]  # c's cut completion is context only
    assert out.stats["rules"] == {"context_exceeded_masked": {"rollouts": 1, "tokens": 3},
                                  "length_masked": {"rollouts": 1, "count": 1, "tokens": 2}}
    assert out.stats["rollouts"]["left_out"] == {"context_exceeded_masked": 1}
    kept = build([job], RowOptions(length_completions="keep", context_exceeded="keep"), "rloo")
    assert {r["rollout_id"] for r in kept.rollouts} == {"a", "b", "c"} and kept.stats["rules"] == {}
    assert sum(r.trainable for r in kept.rows) == 2 + 3 + 3
