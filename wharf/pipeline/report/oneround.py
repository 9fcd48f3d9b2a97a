"""The plots of a run with one round so far: what one round holds (success per task, the length
of each answer, each optimizer step, the stage times), not curves over rounds of a single point."""
from __future__ import annotations

from .data import STAGES, RoundData
from .plots import Plot, offpolicy, reward, training


def tasks(rounds: list[RoundData], fig) -> bool:
    r = rounds[-1]
    if not r.success_by_task:
        return False
    ax = fig.subplots()
    names = list(r.success_by_task)[::-1]  # the first task on top
    bars = ax.barh(names, [r.success_by_task[t] for t in names], color="C0")
    ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=2)  # a task at 0 has no bar: its value says so
    if r.mean_reward is not None:
        ax.axvline(r.mean_reward, color="k", linestyle="--", label=f"mean reward {r.mean_reward:.3f}")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlim(0, 1)
    ax.set_xlabel("success rate (share of attempts with reward > 0)")
    ax.tick_params(axis="y", labelsize=7 if len(names) > 12 else 9)
    ax.set_title(f"round {r.k} ({r.policy}): {r.rollouts} rollouts")
    ax.grid(alpha=0.3, axis="x")
    return True


def lengths(rounds: list[RoundData], fig) -> bool:
    r = rounds[-1]
    if not r.call_lengths:
        return False
    ax = fig.subplots()
    lo, hi = min(r.call_lengths), max(r.call_lengths)
    # a bin a token where the lengths span few (a bar at each length), else 30 bins
    bins = [x - 0.5 for x in range(lo, hi + 2)] if hi - lo < 30 else 30
    ax.hist(r.call_lengths, bins=bins, color="C1")
    ax.set_xlabel("completion tokens")
    ax.set_ylabel("calls")
    ax.set_title(f"round {r.k}: completion tokens of each of {len(r.call_lengths)} calls "
                 f"(mean {sum(r.call_lengths) / len(r.call_lengths):.0f})")
    ax.grid(alpha=0.3)
    return True


def walls(rounds: list[RoundData], fig) -> bool:
    r = rounds[-1]
    stages = [s for s in STAGES if r.walls.get(s)]
    if not stages:
        return False
    ax = fig.subplots()
    ax.barh(stages[::-1], [r.walls[s] for s in stages[::-1]], color="C2")
    ax.set_xlabel("seconds")
    ax.set_title(f"round {r.k}: wall time per stage")
    ax.grid(alpha=0.3, axis="x")
    return True


def heldout(rounds: list[RoundData], fig) -> bool:
    """Where the loop evaluated after the round: the base's and policy-v1's held-out reward beside
    the round's training reward (points at rounds 0 and 1, a comparison, not a curve)."""
    return bool(rounds[-1].heldout) and reward(rounds, fig)


ONE_ROUND: dict[str, tuple[str, Plot, tuple[float, float]]] = {
    "reward": ("Training and held-out reward", heldout, (6, 3.6)),
    "tasks": ("Success rate per task", tasks, (6, 3.6)),
    "lengths": ("Answer lengths", lengths, (6, 3.6)),
    "training": ("Loss, KL, clip fraction, entropy per step", training, (10, 6)),
    "walls": ("Stage wall times", walls, (6, 2.4)),
    "offpolicy": ("Off-policy statistics per job (replay)", offpolicy, (10, 3.6)),
}
# What only two rounds or more can show (said on a one-round page instead of drawn).
CURVES = "reward and success per round, groups and rows, mismatch, answer length and stage times over rounds"
