"""The report's plots: matplotlib (Agg, no display), one PNG per topic; a plot with no data is
not drawn (the page then says so instead of showing an empty frame)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .data import STAGES, RoundData  # noqa: E402
from .experiment import ARM  # noqa: E402

Plot = Callable[[list[RoundData], plt.Figure], bool]  # draws into the figure; False: nothing to show


def _series(rounds: list[RoundData], get) -> tuple[list[int], list[float]]:
    pts = [(r.k, get(r)) for r in rounds if get(r) is not None]
    return [k for k, _ in pts], [v for _, v in pts]


def _line(ax, rounds, get, label, **kw) -> bool:
    xs, ys = _series(rounds, get)
    if xs:
        ax.plot(xs, ys, marker="o", label=label, **kw)
    return bool(xs)


def _legend(ax, **kw) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def _rounds_axis(ax, title: str, rounds: list[RoundData] = (), more: tuple[int, ...] = ()) -> None:
    ax.set_xlabel("round")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ks = [r.k for r in rounds] + list(more)  # `more`: x of points past the rounds (a held-out policy-v<k+1>)
    if ks:  # every round's slot, half a round either side: a lone point sits at its round, not in ±0.04
        ax.set_xlim(min(ks) - 0.5, max(ks) + 0.5)


def _panels(fig, panels: list[tuple[bool, Callable]]) -> bool:
    """Side by side, only the panels that have data (draw(ax) each); False when none has."""
    live = [draw for has, draw in panels if has]
    if live:
        for ax, draw in zip(fig.subplots(1, len(live), squeeze=False)[0], live):
            draw(ax)
    return bool(live)


def _has(rounds: list[RoundData], *gets) -> bool:
    return any(get(r) is not None for r in rounds for get in gets)


def heldout_points(rounds: list[RoundData]) -> list[tuple[int, float, float, float]]:
    """(k, mean, low, high) of policy-v<k> on the held-out set: the base at 0 (from the first
    evaluation), then each evaluated policy at its own k, the x of the round it samples."""
    pts = {}
    for r in rounds:
        h = r.heldout
        if h:
            pts.setdefault(0, h.get("base") or {})
            pts[h["k"]] = h
    def bound(d: dict, key: str) -> float:
        return d[key] if isinstance(d.get(key), (int, float)) else d["mean"]  # null: one task, no interval
    return [(k, d["mean"], bound(d, "low"), bound(d, "high"))
            for k, d in sorted(pts.items()) if isinstance(d.get("mean"), (int, float))]


def reward(rounds, fig) -> bool:
    ax = fig.subplots()
    drawn = _line(ax, rounds, lambda r: r.mean_reward, "training reward (policy-v<k> on the training tasks)")
    drawn |= _line(ax, rounds, lambda r: r.success_rate, "training success rate", linestyle="--")
    held = heldout_points(rounds)
    if held:
        ks, ms, lo, hi = zip(*held)
        err = [[max(m - v, 0) for m, v in zip(ms, lo)], [max(v - m, 0) for m, v in zip(ms, hi)]]
        ax.errorbar(ks, ms, yerr=err, marker="s", capsize=3, label="held-out reward (95% interval)")
    ax.set_ylim(-0.02, 1.02)
    _rounds_axis(ax, "reward per round (round k samples policy-v<k>)", rounds, tuple(p[0] for p in held))
    _legend(ax, fontsize=8)
    return drawn or bool(held)


def tasks(rounds, fig) -> bool:
    ax = fig.subplots()
    names = sorted({t for r in rounds for t in r.success_by_task})
    for t in names:
        _line(ax, rounds, lambda r, t=t: r.success_by_task.get(t), t)
    ax.set_ylim(-0.02, 1.02)
    _rounds_axis(ax, "success rate per task", rounds)
    if names:
        _legend(ax, fontsize=7, ncol=2)
    return bool(names)


def signal(rounds, fig) -> bool:
    def groups(ax):
        _line(ax, rounds, lambda r: r.groups, "groups")
        _line(ax, rounds, lambda r: r.groups_with_signal, "with signal (mixed rewards)")
        _line(ax, rounds, lambda r: r.groups_used, "used by convert", linestyle="--")
        _rounds_axis(ax, "groups", rounds)
        _legend(ax, fontsize=8)

    def rows(ax):
        _line(ax, rounds, lambda r: r.prefix_breaks, "prefix breaks")
        _line(ax, rounds, lambda r: r.rows, "training rows")
        _rounds_axis(ax, "rows and prefix breaks", rounds)
        _legend(ax, fontsize=8)

    return _panels(fig, [(_has(rounds, lambda r: r.groups, lambda r: r.groups_used), groups),
                         (_has(rounds, lambda r: r.prefix_breaks, lambda r: r.rows), rows)])


TRAIN_KEYS = (("loss", "loss"), ("kl", "KL to base"), ("clip", "clip fraction"), ("entropy", "entropy"))


def _step_value(s: dict, key: str):
    if key == "clip":
        lo, hi = s.get("clip_low"), s.get("clip_high")
        return None if lo is None and hi is None else (lo or 0.0) + (hi or 0.0)
    return s.get(key)


def training(rounds, fig) -> bool:
    """Per optimizer step across the run, with the round boundaries marked."""
    axes = fig.subplots(2, 2).ravel()
    drawn = False
    for ax, (key, title) in zip(axes, TRAIN_KEYS):
        x = 0
        for r in rounds:
            ys = [_step_value(s, key) for s in r.steps]
            pts = [(x + i, y) for i, y in enumerate(ys) if isinstance(y, (int, float))]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", color="C0")
                drawn = True
            if r.steps:
                ax.axvline(x - 0.5, color="grey", alpha=0.3)
            x += len(r.steps)
        ax.set_title(title)
        ax.set_xlabel("optimizer step (grey: round starts)")
        ax.grid(alpha=0.3)
        ax.set_xlim(-0.5, max(x, 1) - 0.5)  # one step: its slot, not ±0.04 around it
        ax.xaxis.get_major_locator().set_params(integer=True)
    return drawn


def mismatch(rounds, fig) -> bool:
    def gap(ax):
        _line(ax, rounds, lambda r: r.mismatch_mean, "mean |Δ log-prob| (first step)")
        _line(ax, rounds, lambda r: r.mismatch_max, "max", linestyle="--")
        if all(v > 0 for r in rounds for v in (r.mismatch_mean, r.mismatch_max) if v is not None):
            ax.set_yscale("log")  # 1e-6 on-policy vs 1e-1 off-policy: orders of magnitude
        _rounds_axis(ax, "train/inference mismatch", rounds)
        _legend(ax, fontsize=8)

    def ratio(ax):
        _line(ax, rounds, lambda r: r.step_mean("ratio_mean"), "mean ratio to behaviour")
        _rounds_axis(ax, "importance ratio (mean over steps)", rounds)

    return _panels(fig, [(_has(rounds, lambda r: r.mismatch_mean, lambda r: r.mismatch_max), gap),
                         (_has(rounds, lambda r: r.step_mean("ratio_mean")), ratio)])


def lengths(rounds, fig) -> bool:
    ax = fig.subplots()
    drawn = _line(ax, rounds, lambda r: r.response_tokens, "completion tokens per call")
    _rounds_axis(ax, "response length", rounds)
    return drawn


def walls(rounds, fig) -> bool:
    ax = fig.subplots()
    ks = [r.k for r in rounds if r.walls]
    bottom = [0.0] * len(ks)
    for stage in STAGES:
        vals = [next(r.walls.get(stage, 0.0) for r in rounds if r.k == k) / 60 for k in ks]
        if any(vals):
            ax.bar(ks, vals, bottom=bottom, label=stage)
            bottom = [b + v for b, v in zip(bottom, vals)]
    _rounds_axis(ax, "stage wall time (minutes)", rounds)
    if ks:
        _legend(ax)
    return bool(ks)


def offpolicy(rounds, fig) -> bool:
    """Replay: how far each job's behaviour policy is from the policy trained on it."""
    jobs = [j for r in rounds for j in r.jobs]
    if not jobs:
        return False
    ax1, ax2 = fig.subplots(1, 2)
    names = [j.get("name") or str(i) for i, j in enumerate(jobs)]
    ax1.bar(names, [j.get("mismatch_mean") or 0 for j in jobs])
    ax1.set_title("mean |Δ log-prob| per job")
    ax2.bar(names, [j.get("ratio_mean") or 0 for j in jobs], label="mean")
    ax2.plot(names, [j.get("ratio_p95") or 0 for j in jobs], "k^", label="p95")
    ax2.axhline(1.0, color="grey", alpha=0.5)
    ax2.set_title("ratio π_train / π_behaviour per job")
    _legend(ax2, fontsize=8)
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    return True


PLOTS: dict[str, tuple[str, Plot, tuple[float, float]]] = {
    "reward": ("Training and held-out reward", reward, (6, 3.6)),
    "tasks": ("Success rate per task", tasks, (6, 3.6)),
    "signal": ("Groups with signal, rows, prefix breaks", signal, (10, 3.6)),
    "training": ("Loss, KL, clip fraction, entropy", training, (10, 6)),
    "mismatch": ("Mismatch and importance ratio", mismatch, (10, 3.6)),
    "lengths": ("Response length", lengths, (6, 3.6)),
    "walls": ("Stage wall times", walls, (6, 3.6)),
    "offpolicy": ("Off-policy statistics per job (replay)", offpolicy, (10, 3.6)),
}


def compare_rewards(runs: dict[str, list[RoundData]], out: Path, walls: dict[str, float] | None = None) -> Path:
    """Mean reward per round of several runs side by side (the learning experiment's figure)."""
    fig = plt.figure(figsize=(10, 3.8), layout="constrained")
    axes = fig.subplots(1, len(runs), sharey=True, squeeze=False)[0]
    for ax, (label, rounds) in zip(axes, runs.items()):
        rounds = [r for r in rounds if not r.partial]  # finished rounds only
        _line(ax, rounds, lambda r: r.mean_reward, "mean reward")
        _line(ax, rounds, lambda r: r.success_rate, "success rate", linestyle="--")
        title = label if not walls or label not in walls else f"{label} ({walls[label] / 60:.1f} min/round)"
        _rounds_axis(ax, title)
        ax.set_ylim(-0.02, 1.02)
        _legend(ax, fontsize=8)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def experiment_figure(runs: dict[str, list[RoundData]], pairs: list, out: Path) -> Path:
    """The experiment: each arm's mean reward per round (GRPO solid, control dashed, a color per
    seed), the paired gap GRPO - control of each seed that has both arms with its mean
    (wharf/pipeline/report/experiment.py), each arm's model calls per rollout, and, when the loop
    evaluated (loop.eval_every), each arm's held-out reward per round."""
    arms = [(m, [r for r in rounds if not r.partial]) for m, rounds in ((ARM.search(k), v) for k, v in runs.items()) if m]
    held = {id(done): heldout_points(done) for _, done in arms}
    fig = plt.figure(figsize=(20 if any(held.values()) else 15, 4), layout="constrained")
    left, right, calls, *heldout = fig.subplots(1, 4 if any(held.values()) else 3)
    color = {s: f"C{i}" for i, s in enumerate(sorted({int(m["seed"]) for m, _ in arms}))}
    for m, done in arms:  # every arm, a seed without its control too
        grpo = m["arm"] == "grpo"
        kw = {"color": color[int(m["seed"])], "linestyle": "-" if grpo else "--",
              "label": f"{'GRPO' if grpo else 'control'}, seed {m['seed']}"}
        left.plot(range(len(done)), [r.mean_reward for r in done], marker="o" if grpo else "s", **kw)
        # calls per rollout: a collapse to one-call shortcuts shows here
        _line(calls, done, lambda r: r.calls / r.rollouts if r.calls and r.rollouts else None, **kw)
        if heldout and held[id(done)]:
            ks, ms, *_ = zip(*held[id(done)])
            if list(ks) != list(range(ks[0], ks[-1] + 1)):  # evaluated every few rounds: no line across the gap
                kw = {**kw, "linestyle": "none"}
            heldout[0].plot(ks, ms, marker="o" if grpo else "s", **kw)
    for p in pairs:
        pts = [(k, g) for k, g in enumerate(p.gaps) if g is not None]
        right.plot([k for k, _ in pts], [g for _, g in pts], marker="o", color=color[p.seed], alpha=0.6, label=f"seed {p.seed}")
    n = max((len(p.gaps) for p in pairs), default=0)
    means = [(k, [p.gaps[k] for p in pairs if k < len(p.gaps) and p.gaps[k] is not None]) for k in range(n)]
    means = [(k, sum(g) / len(g)) for k, g in means if g]
    if means:
        right.plot([k for k, _ in means], [m for _, m in means], color="k", linewidth=2.5, label="mean over seeds")
    right.axhline(0, color="grey", linewidth=0.8)
    left.set_ylim(-0.02, 1.02)
    left.set_ylabel("mean reward")
    right.set_ylabel("GRPO - control")
    _rounds_axis(left, "mean reward per round")
    _rounds_axis(right, "paired gap, same sampling seeds")
    calls.set_ylabel("model calls per rollout")
    calls.set_ylim(bottom=0)
    _rounds_axis(calls, "calls per rollout")
    _legend(calls, fontsize=7)
    if heldout:
        heldout[0].set_ylim(-0.02, 1.02)
        heldout[0].set_ylabel("held-out reward")
        _rounds_axis(heldout[0], "held-out reward of policy-v<k> (never trained on)")
        _legend(heldout[0], fontsize=7)
    _legend(left, fontsize=7)
    _legend(right, fontsize=7)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
