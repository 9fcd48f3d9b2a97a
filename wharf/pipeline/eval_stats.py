"""The figures `wharf eval` reports, as pure functions of (task, attempt, reward) trials.

Intervals are clustered by task: the trials of one task share its difficulty, so they are not
independent draws, and an interval over all trials as if they were would be too narrow (with 8
tasks x 4 attempts it would claim 31 degrees of freedom where there are 7). Each task's mean is
one observation; the interval is Student's t over those per-task means (n_tasks - 1 degrees of
freedom). It is exact for normal task means and conservative enough for a handful of tasks,
where a bootstrap over 8 clusters would be too narrow and would change from run to run.

Where the split says which tasks are near-copies of each other (a `family` in each task's
metadata: the held-out splits hold two instances of each kind of task), tasks of one family are
not independent either: the interval is clustered by family instead, each family's mean (the mean
of its tasks' means) one observation, n_families - 1 degrees of freedom. A task with no family is
a family of its own.

The paired difference of two policies pairs trials by (task, attempt): `wharf eval` samples
every policy with the same seed for the same (task, attempt), so the pair shares its sandbox,
prompt and random stream, and only the policy differs. Per task, the mean of the paired
differences is one observation; the same t interval is taken over tasks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import fmean, stdev

LEVEL = 0.95


@dataclass(frozen=True)
class Trial:
    task_id: str
    attempt: int
    reward: float
    family: str | None = None  # the task's `family` (task metadata): what is independent of what

    @property
    def cluster(self) -> str:
        return self.family or self.task_id

    @property
    def success(self) -> bool:
        return self.reward > 0  # as collect's manifest counts a success


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    clusters: int  # the tasks (or task families) it was taken over (clusters - 1 degrees of freedom)
    by: str = "task"  # what it is clustered by: "task" or "family"

    def __str__(self) -> str:
        if self.clusters < 2:
            return f"{self.mean:.3f} [no interval: {self.clusters} {self.by}]"
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"


@dataclass(frozen=True)
class PolicyFigures:
    trials: int
    reward: Interval
    pass_at: dict[int, float]  # k -> pass@k, the mean over tasks of the unbiased estimate
    successes: dict[str, tuple[int, int]]  # task -> (successes, trials)


def t_two_sided_cdf(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with an integer df (Abramowitz & Stegun 26.7.3-4: a finite
    series in cos(theta), theta = atan(t / sqrt(df)))."""
    if df < 1:
        raise ValueError(f"df={df}: needs at least 1 degree of freedom")
    theta = math.atan(abs(t) / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:  # odd: 2/pi (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for j in range(1, (df - 1) // 2):
            term *= c2 * (2 * j) / (2 * j + 1)
            total += term
        return 2 / math.pi * (theta + s * math.cos(theta) * total)
    term, total = 1.0, 1.0  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
    for j in range(1, df // 2):
        term *= c2 * (2 * j - 1) / (2 * j)
        total += term
    return s * total


def t_quantile(level: float, df: int) -> float:
    """The t with P(|T| <= t) = level (bisection on the monotone CDF above)."""
    lo, hi = 0.0, 1.0
    while t_two_sided_cdf(hi, df) < level:
        hi *= 2
    for _ in range(64):  # the bracket shrinks to float precision
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_cdf(mid, df) < level else (lo, mid)
    return (lo + hi) / 2


def t_interval(values: list[float], level: float = LEVEL, by: str = "task") -> Interval:
    """Mean of `values` (one per cluster) with its two-sided t interval; a single value has none."""
    if not values:
        raise ValueError("no values to take an interval over")
    m = fmean(values)
    if len(values) < 2:
        return Interval(m, math.nan, math.nan, len(values), by)
    half = t_quantile(level, len(values) - 1) * stdev(values) / math.sqrt(len(values))
    return Interval(m, m - half, m + half, len(values), by)


def clustered_interval(task_values: dict[str, float], family: dict[str, str | None]) -> Interval:
    """The t interval over per-family means of per-task values (by task where no task has a family)."""
    clusters: dict[str, list[float]] = {}
    for task, v in sorted(task_values.items()):
        clusters.setdefault(family.get(task) or task, []).append(v)
    by = "family" if any(family.get(t) for t in task_values) else "task"
    return t_interval([fmean(vs) for _, vs in sorted(clusters.items())], by=by)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with c successes in n trials: 1 - C(n-c, k) / C(n, k), as a
    product (no huge binomials): 1 - prod_{i=n-c+1}^{n} (1 - k / i)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@{k} of {c} successes in {n} trials: needs 0 <= c <= n and 1 <= k <= n")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def by_task(trials: list[Trial]) -> dict[str, list[Trial]]:
    out: dict[str, list[Trial]] = {}
    for t in trials:
        out.setdefault(t.task_id, []).append(t)
    return dict(sorted(out.items()))


def figures(trials: list[Trial], ks: tuple[int, ...] = (1,)) -> PolicyFigures:
    """Mean reward with its task- (or family-) clustered interval, pass@k for each k every task has trials
    for, and successes per task."""
    tasks = by_task(trials)
    if not tasks:
        raise ValueError("no trials")
    n_min = min(len(ts) for ts in tasks.values())
    successes = {t: (sum(x.success for x in ts), len(ts)) for t, ts in tasks.items()}
    pass_at = {k: fmean(pass_at_k(n, c, k) for c, n in successes.values()) for k in sorted(set(ks)) if k <= n_min}
    reward = clustered_interval({t: fmean(x.reward for x in ts) for t, ts in tasks.items()}, _families(trials))
    return PolicyFigures(len(trials), reward, pass_at, successes)


def paired_difference(a: list[Trial], b: list[Trial]) -> tuple[Interval, int]:
    """Mean of a - b over trials paired by (task, attempt), with the t interval over per-task (or
    per-family) mean differences; and the number of pairs. Trials without a partner are left out."""
    rb = {(t.task_id, t.attempt): t.reward for t in b}
    diffs: dict[str, list[float]] = {}
    for t in a:
        if (t.task_id, t.attempt) in rb:
            diffs.setdefault(t.task_id, []).append(t.reward - rb[(t.task_id, t.attempt)])
    if not diffs:
        raise ValueError("no (task, attempt) pair in common: the two policies ran different trials")
    iv = clustered_interval({task: fmean(d) for task, d in diffs.items()}, _families(a))
    return iv, sum(map(len, diffs.values()))


def _families(trials: list[Trial]) -> dict[str, str | None]:
    return {t.task_id: t.family for t in trials}
