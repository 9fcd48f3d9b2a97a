"""The learning experiment's summary: GRPO against its zero-advantage control, seed by seed.

`make experiment-multiturn ARM=grpo|zero SEED=N` writes runs/multiturn-<arm>-s<N>; the two arms of
one seed share their sampling seeds (round k of both draws the same per-call seeds), so the
honest figure is the paired gap, GRPO minus control, per seed and round, and its spread over
seeds. Labels name the arm and the seed: `...grpo-s<N>` and `...zero-s<N>` (any prefix).
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from .data import RoundData

ARM = re.compile(r"(?P<arm>grpo|zero)-s(?P<seed>\d+)$")


@dataclass(frozen=True)
class SeedGap:
    seed: int
    grpo: list[float | None]  # mean reward per round
    zero: list[float | None]

    @property
    def gaps(self) -> list[float | None]:
        """GRPO minus control per round (None where either arm has no finished round)."""
        return [None if g is None or z is None else g - z for g, z in zip(self.grpo, self.zero)]


def finished_rewards(rounds: list[RoundData]) -> list[float | None]:
    return [r.mean_reward for r in rounds if not r.partial]


def pair_arms(runs: dict[str, list[RoundData]]) -> list[SeedGap]:
    """The seeds that have both arms, in seed order (pure)."""
    arms: dict[int, dict[str, list[float | None]]] = {}
    for label, rounds in runs.items():
        m = ARM.search(label)
        if m:
            arms.setdefault(int(m["seed"]), {})[m["arm"]] = finished_rewards(rounds)
    return [SeedGap(s, a["grpo"], a["zero"]) for s, a in sorted(arms.items()) if {"grpo", "zero"} <= set(a)]


def spread(values: list[float]) -> tuple[float, float, float]:
    """Mean, min and max (pure)."""
    return statistics.fmean(values), min(values), max(values)


def summary_lines(pairs: list[SeedGap]) -> list[str]:
    """Per seed: rewards of both arms and the gap per round; then the gap's mean and range."""
    out = []
    for p in pairs:
        fmt = lambda xs: " ".join("-" if x is None else f"{x:.3f}" for x in xs)  # noqa: E731
        out.append(f"seed {p.seed}: grpo {fmt(p.grpo)} | zero {fmt(p.zero)} | grpo - zero {fmt(p.gaps)}")
    n = max((len(p.gaps) for p in pairs), default=0)
    for k in range(n):
        gaps = [p.gaps[k] for p in pairs if k < len(p.gaps) and p.gaps[k] is not None]
        if gaps:
            mean, lo, hi = spread(gaps)
            out.append(f"round {k}: grpo - zero {mean:+.3f} over {len(gaps)} seed(s) (range {lo:+.3f} .. {hi:+.3f})")
    return out
