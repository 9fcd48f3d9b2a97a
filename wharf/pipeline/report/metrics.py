"""A round's figures as flat metrics: what the loop sends to the trackers (`round/<name>`, x: the
round; wharf/core/tracking.py). Pure: a RoundData in, a dict out; a figure the round lacks is left out."""
from __future__ import annotations

from .data import STAGES, RoundData


def _ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def _step_mean(rd: RoundData, get) -> float | None:
    vals = [v for v in (get(s) for s in rd.steps) if isinstance(v, (int, float))]
    return sum(vals) / len(vals) if vals else None


def _clip(step: dict) -> float | None:
    lo, hi = step.get("clip_low"), step.get("clip_high")
    return None if lo is None and hi is None else (lo or 0.0) + (hi or 0.0)


def round_metrics(rd: RoundData) -> dict[str, float]:
    """Reward and success, the groups and rows the round made, tokens, the prefix cache's hit
    rate, the update (means over the round's optimizer steps, its measured shift), stage times."""
    m = {
        "mean_reward": rd.mean_reward, "success_rate": rd.success_rate, "rollouts": rd.rollouts,
        "groups": rd.groups, "groups_with_signal": rd.groups_with_signal, "groups_used": rd.groups_used,
        "calls_per_rollout": _ratio(rd.calls, rd.rollouts), "completion_tokens_per_call": rd.response_tokens,
        "prefix_cache_hit_rate": rd.prefix_cache_hit_rate, "rows": rd.rows, "prefix_breaks": rd.prefix_breaks,
        "trainable_tokens": rd.trainable_tokens, "steps": len(rd.steps) or None,
        "loss": rd.step_mean("loss"), "kl": rd.step_mean("kl"), "clip_fraction": _step_mean(rd, _clip),
        "grad_norm": rd.step_mean("grad_norm"), "entropy": rd.step_mean("entropy"),
        "mismatch_mean": rd.mismatch_mean, "delta_logprob": rd.shift.get("delta_mean"),
        "kl_to_previous": rd.shift.get("kl"), "heldout_reward": rd.heldout.get("mean"),
        **{f"{stage}_s": rd.walls.get(stage) for stage in STAGES},
    }
    return {k: float(v) for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
