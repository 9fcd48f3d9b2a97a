"""The loop's health checks as pure functions: the facts of one round in (RoundFacts), one
HealthCheck out per check. wharf/pipeline/health.py gathers the facts from the round's files, writes
health.json and stops the loop; each check has a key under `loop.health` that relaxes it
(wharf/core/config_loop.py's HealthConfig).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from wharf.core.config import HealthConfig
from wharf.core.layout import policy_name


@dataclass(frozen=True)
class HealthCheck:
    name: str
    round: int
    ok: bool
    expected: str
    seen: str
    file: str
    relax: str  # the config key and value that turn the check off

    def message(self) -> str:
        return (f"round {self.round}: health check '{self.name}' failed: expected {self.expected}; "
                f"saw {self.seen} ({self.file}). Fix the cause, or relax the check with {self.relax}")


@dataclass
class RoundFacts:
    """What the checks look at, as gathered from one round's files (None: the file was missing)."""

    k: int
    policy: str  # the policy that should have sampled the round
    allowed: tuple[str, ...] = ()  # overlapping rounds: the other policies that may sample round k
    lag: int = 0  # versions between `policy` and policy-v<k>, the one round k trains from
    turn_policies: dict[str, int] = field(default_factory=dict)  # policy -> turns
    turn_status: dict[str, int] = field(default_factory=dict)  # status -> turns
    cut: tuple[int, int] = (0, 0)  # answers cut at max_tokens (finish_reason length), answers
    start_cut: tuple[int, int] | None = None  # the same of round 0 (None: round 0, or not found)
    timeouts: tuple[int, int] = (0, 0)  # rollouts that ran out of time (agent_timeout), rollouts
    start_timeouts: tuple[int, int] | None = None  # the same of round 0 (None: round 0, or not found)
    served_mismatch: float | None = None  # train's first step: mean |trainer - endpoint| log-prob
    loss_tokens: int | None = None
    carried: bool = False  # the loop carried the previous adapter (no signal)
    shift: dict | None = None  # wharf/train/shift.py: delta_mean, weight_delta, kl, tokens
    rollouts_read: int | None = None
    left_out: dict[str, int] = field(default_factory=dict)  # convert's reasons, groups excluded
    steps: list[dict] = field(default_factory=list)  # train's metrics.jsonl: step, rows, grad_norm, kl, ...
    files: dict[str, str] = field(default_factory=dict)  # fact -> the file it came from
    published: str | None = None  # the policy this round trained, when it was published
    refused: dict[str, str] = field(default_factory=dict)  # replica url -> why it does not serve it

    @property
    def rows_trained(self) -> int:
        return sum(int(s.get("rows") or 0) for s in self.steps)

    @property
    def rows_masked(self) -> int:
        return sum(int(s.get("masked_rows") or 0) for s in self.steps)


def check_served(f: RoundFacts, cfg: HealthConfig) -> HealthCheck:
    expected = f"every call sampled by {f.policy} and answered"
    if cfg.max_served_mismatch > 0:
        expected += f", trainer vs endpoint log-prob mismatch <= {cfg.max_served_mismatch:g}"
    seen, ok = [], True
    allowed = set(f.allowed) | {f.policy}
    others = {p: n for p, n in f.turn_policies.items() if p not in allowed}
    n = sum(f.turn_policies.values())
    if not n:
        ok, seen = False, ["no turns recorded"]
    elif others:
        ok = False
        seen.append(f"{sum(others.values())} of {n} calls by {', '.join(sorted(others))}")
    if n and not f.turn_status.get("ok"):
        ok = False
        seen.append(f"none of {n} calls answered ({_counts(f.turn_status)})")
    mm = f.served_mismatch
    # rows of an older policy differ from the trainer's start policy by design: the gap is the
    # policy change the importance weights correct, not the endpoint's error
    if cfg.max_served_mismatch > 0 and mm is not None and mm > cfg.max_served_mismatch and not f.lag:
        ok = False
        seen.append(f"mismatch {mm:.3g}: the endpoint served other weights than {f.policy}")
    if ok:
        seen = [f"{n} calls by {f.policy}" + (f", mismatch {mm:.2g}" if mm is not None else "")]
        if f.lag:
            seen.append(f"{f.lag} policy behind {policy_name(f.k)}, as loop.max_staleness allows (mismatch not "
                        "checked: it holds the policy change)")
    return HealthCheck("policy_served", f.k, ok or not cfg.policy_served, expected, "; ".join(seen),
                       f.files.get("turns", "?"), "loop.health.policy_served=false")


def check_trainable(f: RoundFacts, cfg: HealthConfig) -> HealthCheck:
    n = f.loss_tokens
    seen = "no convert stats" if n is None else f"{n} loss tokens"
    if n == 0:
        seen += " (every group's rewards were equal: nothing to learn from)"
    ok = cfg.min_trainable_tokens == 0 or (n is not None and n >= cfg.min_trainable_tokens)
    return HealthCheck("trainable_tokens", f.k, ok, f">= {cfg.min_trainable_tokens} loss tokens", seen,
                       f.files.get("convert", "?"), "loop.health.min_trainable_tokens=0")


def check_shift(f: RoundFacts, cfg: HealthConfig) -> HealthCheck:
    expected = (f"the new adapter differs from the previous policy and moves it: mean |log pi_new - "
                f"log pi_prev| >= {cfg.min_policy_shift:g} on the round's own loss tokens")
    relax, file = "loop.health.min_policy_shift=0", f.files.get("shift", "?")
    if f.carried or f.loss_tokens == 0:
        return HealthCheck("policy_moved", f.k, True, expected, "not trained (policy carried unchanged)", file, relax)
    s = f.shift
    if s is None:
        return HealthCheck("policy_moved", f.k, cfg.min_policy_shift == 0, expected, "no shift measured", file, relax)
    d, w = s.get("delta_mean"), s.get("weight_delta")
    seen = f"mean |delta log-prob| {d:.3g} over {s.get('tokens')} tokens, KL {s.get('kl', 0):.3g}, max |delta weight| {w:.3g}"
    ok = cfg.min_policy_shift == 0 or (w > 0 and d >= cfg.min_policy_shift)
    return HealthCheck("policy_moved", f.k, ok, expected, seen, file, relax)


def check_bad_share(f: RoundFacts, cfg: HealthConfig) -> HealthCheck:
    expected = f"at most {cfg.max_bad_share:.0%} of rollouts infra errors or unscorable, and of rows masked"
    relax = "loop.health.max_bad_share=1"
    if not f.rollouts_read:
        return HealthCheck("bad_share", f.k, cfg.max_bad_share >= 1, expected, "no rollouts read by convert",
                           f.files.get("convert", "?"), relax)
    bad = sum(f.left_out.values())
    share = bad / f.rollouts_read
    masked = f.rows_masked / f.rows_trained if f.rows_trained else 0.0
    seen = f"{bad} of {f.rollouts_read} rollouts left out ({_counts(f.left_out) or 'none'})"
    if f.rows_trained:
        seen += f", {f.rows_masked} of {f.rows_trained} rows masked"
    ok = cfg.max_bad_share >= 1 or (share <= cfg.max_bad_share and masked <= cfg.max_bad_share)
    file = f.files.get("convert", "?") if share > cfg.max_bad_share or not f.rows_trained else f.files.get("metrics", "?")
    return HealthCheck("bad_share", f.k, ok, expected, seen, file, relax)


def check_steps(f: RoundFacts, cfg: HealthConfig) -> HealthCheck:
    limit = cfg.max_grad_norm
    expected = f"every optimizer step's gradient norm before clipping <= {limit:g}"
    ok, seen = True, "no optimizer step"
    if f.steps:
        worst = max(f.steps, key=lambda s: float(s.get("grad_norm") or 0.0))
        g, kl = float(worst.get("grad_norm") or 0.0), worst.get("kl")
        seen = f"largest {g:.3g} (step {worst.get('step')}" + (f", KL estimate {kl:.3g}" if kl else "") + ")"
        ok = limit == 0 or g <= limit
        if not ok:
            seen += ": a few tokens outweighed the step and train.max_grad_norm clipped it to their direction"
    return HealthCheck("steps_stable", f.k, ok, expected, seen, f.files.get("metrics", "?"),
                       "loop.health.max_grad_norm=0")


def check_replicas(f: RoundFacts, cfg: HealthConfig) -> HealthCheck:
    expected = "every replica the proxy routes to serves the published policy"
    if f.published is None:
        seen = "nothing published"
    elif f.refused:
        seen = "; ".join(f"{url} refused {f.published} ({why})" for url, why in sorted(f.refused.items()))
    else:
        seen = f"every replica serves {f.published}"
    return HealthCheck("replicas_serve", f.k, not f.refused or not cfg.all_replicas_serve, expected, seen,
                       f.files.get("published", "?"), "loop.health.all_replicas_serve=false")


def _rise(name: str, f: RoundFacts, cfg: HealthConfig, key: str, now: tuple[int, int],
          start: tuple[int, int] | None, what: str, counted: str, fact: str, why: str) -> HealthCheck:
    """Check `name`: the share `now` (count, total) of round k rose at most cfg.<key> over round
    0's `start` (None: not found); `why` says what a failure means."""
    limit = getattr(cfg, key)
    (count, n) = now
    share = count / n if n else 0.0
    seen = f"{count} of {n} {counted} ({share:.0%})"
    ok = True
    if start is None or not start[1]:
        seen += "; round 0 is the reference" if f.k == 0 else "; no round 0 to compare with"
    else:
        share0 = start[0] / start[1]
        seen += f", round 0: {start[0]} of {start[1]} ({share0:.0%})"
        ok = limit >= 1 or share - share0 <= limit
        if not ok:
            seen += f": {why}"
    return HealthCheck(name, f.k, ok, f"the share of {what} at most {limit:.0%} above round 0's", seen,
                       f.files.get(fact, "?"), f"loop.health.{key}=1")


def check_cut(f: RoundFacts, cfg: HealthConfig) -> HealthCheck:
    return _rise("answers_ended", f, cfg, "max_cut_rise", f.cut, f.start_cut, "answers cut at sampling.max_tokens",
                 "answers cut", "turns", "the policy stopped ending its answers (with convert.length_completions=mask, "
                 "the default, nothing trains it back; keep trains them as failures)")


def check_timeouts(f: RoundFacts, cfg: HealthConfig) -> HealthCheck:
    # either way the round trains them as the policy's failures
    return _rise("agents_in_time", f, cfg, "max_timeout_rise", f.timeouts, f.start_timeouts,
                 "rollouts that ran out of time", "rollouts ran out of time", "rollouts",
                 "the host got slower than in round 0 (its slowness trains as the policy's failure), or the "
                 "policy learned to run past the limit (long or endless commands): see the trials' agent logs")


CHECKS = (check_served, check_trainable, check_shift, check_steps, check_bad_share, check_cut, check_timeouts,
          check_replicas)


def run_checks(f: RoundFacts, cfg: HealthConfig) -> list[HealthCheck]:
    return [check(f, cfg) for check in CHECKS]


def _counts(c: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(c.items()))
