"""wharf/pipeline/eval_stats.py against figures worked by hand and against the printed t table."""
from __future__ import annotations

import math
import random

import pytest

from wharf.pipeline.eval_stats import (Trial, figures, paired_difference, pass_at_k, t_interval, t_quantile,
                                 t_two_sided_cdf)


def test_pass_at_k_hand_worked():
    # 4 trials, 1 success, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # 5 trials, 2 successes, k=3: 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 is the success rate
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 3, 2) == 1.0  # n - c < k: every draw of k has one
    # large n: the product form stays finite where the binomials are astronomically large
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_pass_at_k_matches_enumerating_every_draw():
    from itertools import combinations
    outcomes = [1, 0, 0, 1, 0, 0]
    for k in range(1, 7):
        draws = list(combinations(outcomes, k))
        assert pass_at_k(6, 2, k) == pytest.approx(sum(any(d) for d in draws) / len(draws))


def test_t_quantiles_match_the_table():
    # two-sided 95% points of Student's t (any printed table)
    for df, t in {1: 12.706, 2: 4.303, 3: 3.182, 7: 2.365, 10: 2.228, 30: 2.042}.items():
        assert t_quantile(0.95, df) == pytest.approx(t, abs=1e-3)
    assert t_two_sided_cdf(0.0, 5) == 0.0 and t_two_sided_cdf(1e9, 4) == pytest.approx(1.0)


def test_t_interval_hand_worked():
    # per-task means 0, 0.5, 1: mean 0.5, sd 0.5, se 0.5/sqrt(3), t(0.975, 2) = 4.3027
    iv = t_interval([0.0, 0.5, 1.0])
    half = 4.302653 * 0.5 / math.sqrt(3)
    assert (iv.mean, iv.low, iv.high, iv.clusters) == pytest.approx((0.5, 0.5 - half, 0.5 + half, 3), abs=1e-5)
    assert math.isnan(t_interval([0.3]).low)


def test_interval_covers_at_its_level():
    """An independent check: normal per-task means, 2000 draws of 8 tasks, ~95% of intervals hold mu."""
    rng = random.Random(0)
    hits = sum(iv.low <= 0.3 <= iv.high for iv in (t_interval([rng.gauss(0.3, 0.2) for _ in range(8)])
                                                      for _ in range(2000)))
    assert 0.935 <= hits / 2000 <= 0.965


def test_figures_cluster_by_task_and_count_successes():
    trials = [Trial("a", i, r) for i, r in enumerate([1, 1, 0, 0])] + [Trial("b", i, 0.0) for i in range(4)]
    f = figures(trials, ks=(1, 2, 8))
    assert f.trials == 8 and f.successes == {"a": (2, 4), "b": (0, 4)}
    assert f.reward.mean == pytest.approx(0.25) and f.reward.clusters == 2
    assert f.pass_at == pytest.approx({1: 0.25, 2: (1 - 1 / 6) / 2})  # pass@8 left out: 4 trials a task


def test_paired_difference_pairs_by_task_and_attempt():
    a = [Trial("x", 0, 1.0), Trial("x", 1, 1.0), Trial("y", 0, 1.0), Trial("y", 1, 0.0), Trial("z", 0, 1.0)]
    b = [Trial("x", 0, 0.0), Trial("x", 1, 1.0), Trial("y", 0, 0.0), Trial("y", 1, 0.0)]
    iv, pairs = paired_difference(a, b)
    assert pairs == 4 and iv.clusters == 2  # z has no partner
    assert iv.mean == pytest.approx(0.5)  # per task: x 0.5, y 0.5
    assert iv.low == pytest.approx(0.5) and iv.high == pytest.approx(0.5)  # no spread between tasks
    with pytest.raises(ValueError, match="no \\(task, attempt\\) pair"):
        paired_difference(a, [Trial("q", 0, 1.0)])


def test_the_interval_is_clustered_by_family_where_tasks_have_one():
    """Hand computation: 3 families of 2 near-copies each. Task means 1, 1 | 0.5, 0.5 | 0, 0.5:
    family means 1, 0.5, 0.25 -> mean 7/12, sd of (1, .5, .25) = sqrt(((5/12)^2 + (1/12)^2 +
    (4/12)^2) / 2) = sqrt(21/144), half-width t(0.95, 2) * sd / sqrt(3) = 4.303 * 0.3819 / 1.732."""
    rewards = {("a-1", "a"): [1, 1], ("a-2", "a"): [1, 1], ("b-1", "b"): [1, 0], ("b-2", "b"): [0, 1],
               ("c-1", "c"): [0, 0], ("c-2", "c"): [1, 0]}
    trials = [Trial(t, i, float(r), fam) for (t, fam), rs in rewards.items() for i, r in enumerate(rs)]
    iv = figures(trials).reward
    half = 4.302653 * math.sqrt(21 / 144) / math.sqrt(3)
    assert (iv.mean, iv.low, iv.high, iv.clusters, iv.by) == pytest.approx((7 / 12, 7 / 12 - half, 7 / 12 + half, 3, "family"))
    by_task = figures([Trial(t.task_id, t.attempt, t.reward) for t in trials]).reward
    assert by_task.clusters == 6 and by_task.by == "task" and by_task.mean == pytest.approx(iv.mean)
    assert by_task.high - by_task.low < iv.high - iv.low  # by task it claims a precision the split has not
    # The paired difference is clustered the same way: b's reward is a's minus 1/2 on family a only.
    b = [Trial(t.task_id, t.attempt, t.reward - (0.5 if t.family == "a" else 0.0), t.family) for t in trials]
    diff, pairs = paired_difference(trials, b)
    assert pairs == 12 and (diff.mean, diff.clusters, diff.by) == pytest.approx((0.5 / 3, 3, "family"))


def test_the_held_out_splits_name_each_task_family():
    from wharf.pipeline.eval import task_families

    for split in ("datasets/multiturn/heldout", "datasets/learn/heldout"):
        fam = task_families(split)
        assert len(fam) == 16 and len(set(fam.values())) == 8, split
        assert all(task.rsplit("-", 1)[0] == f for task, f in fam.items())
    assert task_families("datasets/toy") == {}  # no family: each task its own cluster
