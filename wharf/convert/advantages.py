"""Group-relative advantages (pure; no I/O).

`grpo`: (r - mean) / (std + eps), std the sample std (ddof=1, as TRL and verl take it);
`dr_grpo`: r - mean (Dr. GRPO drops the std); `rloo`: r - mean of the others;
`zero`: a control run: the same groups as the others keep, every advantage 0.
A group whose rewards are all equal, or that has one member, carries no signal and is dropped.
Which rollouts enter a group at all (infra failures out) is the caller's choice.
"""
from __future__ import annotations

import typing
from typing import Sequence

import numpy as np

from wharf.core.config_types import Advantage

ESTIMATORS = typing.get_args(Advantage)  # the config's choices (checked when it loads)


def group_advantages(rewards: Sequence[float], estimator: str = "grpo",
                     eps: float = 1e-6) -> tuple[np.ndarray | None, str | None]:
    """One group's rewards -> (advantages, None), or (None, why it was dropped)."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"convert.advantage: {estimator!r} is not one of {', '.join(ESTIMATORS)}")
    r = np.asarray(rewards, np.float64)
    n = len(r)
    if n < 2:
        return None, "one_member"
    if np.all(r == r[0]):
        return None, "all_equal"
    mean = r.mean()
    if estimator == "grpo":
        return (r - mean) / (r.std(ddof=1) + eps), None
    if estimator == "dr_grpo":
        return r - mean, None
    if estimator == "rloo":
        return r - (r.sum() - r) / (n - 1), None
    return np.zeros(n), None


def advantages_by_group(groups: dict[str, list[float]], estimator: str = "grpo",
                        eps: float = 1e-6) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """{group: rewards} -> ({kept group: advantages}, {dropped group: reason})."""
    kept, dropped = {}, {}
    for g, rewards in groups.items():
        adv, why = group_advantages(rewards, estimator, eps)
        if adv is None:
            dropped[g] = why
        else:
            kept[g] = adv
    return kept, dropped
