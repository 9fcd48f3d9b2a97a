"""The config sections of the loop: its health checks, its held-out evaluation, and eval."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field

from wharf.core import bundled
from wharf.core.config_types import Fraction, NonNegative, NonNegativeFloat, Positive


@dataclass
class HealthConfig:
    """The loop's checks after every round (wharf/pipeline/health.py); each stops the loop when it fails.
    The value that turns a check off is given beside it."""

    # Every turns row of round k was sampled by policy-v<k> (round 0: endpoint.model) and the
    # endpoint answered; false: off.
    policy_served: bool = True
    # ... and the trainer's log-probs of that policy agree with the endpoint's (train's first-step
    # mean |trainer - endpoint| log-prob; an endpoint serving other weights is far off); 0: off.
    max_served_mismatch: NonNegativeFloat = 0.1
    # The new adapter moved the policy on the round's own loss tokens: mean |log pi_new - log
    # pi_prev| at least this (a zero-advantage control run sets 0); 0: off.
    min_policy_shift: NonNegativeFloat = 1e-4
    # Loss tokens the round had after convert (0 when every group's rewards were equal; the
    # policy is then carried unchanged); 0: off.
    min_trainable_tokens: NonNegative = 1
    # Share of the round's rollouts left out as infra errors or unscorable (no turns, no reward,
    # bad input), and share of rows the trainer masked; 1: off.
    max_bad_share: Annotated[float, Field(ge=0, le=1)] = 0.5
    # Every optimizer step's gradient norm before clipping at most this: a step a few tokens
    # outweigh (a KL or ratio blow-up) is clipped to their direction alone; 0: off.
    max_grad_norm: NonNegativeFloat = 20.0
    # The share of the round's answers cut at sampling.max_tokens rose at most this much over
    # round 0's (0.3: 30 points): a policy that stops ending its answers runs every one to the
    # limit, and convert.length_completions=mask leaves those untrained, so nothing pulls it
    # back; 1: off.
    max_cut_rise: Fraction = 0.3
    # The share of the round's rollouts that ran out of time (agent_timeout) rose at most this much
    # over round 0's: a host grown slower, or a policy that learned long or endless commands; both
    # train as the policy's failures; 1: off.
    max_timeout_rise: Fraction = 0.3
    # Every replica the proxy routes to (endpoint.url, proxy.upstreams) took the round's new
    # policy when it was published (one that refused gets none of its calls); false: off.
    all_replicas_serve: bool = True


def policies_loaded(max_staleness: int, evaluates: bool) -> int:
    """Adapters the loop keeps loaded at once: the newest policy and the `max(1, s)` before it (a
    round still sampling; publish unloads older ones), plus a copy while it evaluates."""
    return 1 + max(1, max_staleness) + int(evaluates)


def check_policy_spec(spec: str, key: str) -> str:
    """The forms a policy to evaluate takes (wharf/pipeline/eval.py resolves them): `base`, a run's round
    `<run dir>:<k>` (policy-v<k> of that run), or an adapter dir."""
    head, sep, tail = spec.rpartition(":")
    if not spec.strip() or (sep and (not head or not tail.isdigit())):
        raise ValueError(f"{key}: {spec!r} is not a policy: use base (the endpoint's model), <run dir>:<k> "
                         "(policy-v<k> of that run, e.g. runs/multiturn:5), or an adapter dir (adapter_config.json)")
    return spec


@dataclass
class EvalConfig:
    """`wharf eval` (and the loop's held-out evaluation): policies side by side on one task set."""

    # A harbor task dir or a directory of them; None: collect.dataset.
    dataset: str | None = None
    # base, <run dir>:<k> (policy-v<k> of that run), or an adapter dir; each against the same seeds.
    policies: list[str] = field(default_factory=lambda: ["base"])
    attempts: Positive = 4  # trials per task and policy (pass@k up to k = attempts)
    # The folder under runs/<name>/evals/; None: named after the dataset (datasets/multiturn/heldout
    # -> multiturn-heldout), so the same command resumes and a policy already run is not run again.
    name: str | None = None

    def __post_init__(self):
        if not self.policies:
            raise ValueError("eval.policies is empty: name at least one policy (base, <run dir>:<k>, or an adapter dir)")
        if self.dataset is not None:
            self.dataset = bundled.resolve(self.dataset, "eval.dataset")
        for i, spec in enumerate(self.policies):
            check_policy_spec(spec, f"eval.policies[{i}]")
        if self.name is not None and (not self.name.strip() or "/" in self.name or self.name in (".", "..")):
            raise ValueError(f"eval.name={self.name!r}: a folder name (no '/'), or null to name it after the dataset")


@dataclass
class LoopConfig:
    health: HealthConfig = field(default_factory=HealthConfig)
    # Every this many rounds (0: never) the loop evaluates the policy it just published on
    # eval_dataset (and the base model once) with eval.attempts trials per task: held-out reward
    # per round beside the training reward, in the round's line and the report.
    eval_every: NonNegative = 0
    eval_dataset: str | None = None  # a held-out split, e.g. datasets/multiturn/heldout
    # Rounds that overlap (wharf/pipeline/overlap.py): 0 collects round k+1 only after policy-v<k+1> is
    # published; s >= 1 collects round k+1 while round k trains, from the newest published policy,
    # so a round's rows are at most s policies behind the one it trains (corrected by train.mismatch).
    max_staleness: Annotated[int, Field(ge=0, le=2)] = 0
    # Warm start: round 0 samples from this adapter (published as policy-v0) and round 0's train
    # continues it, instead of the base model and a new LoRA: <run dir>:<k> (policy-v<k> of that
    # run, e.g. an SFT run's) or an adapter dir. Same base model, rank and targets, checked at start.
    init_adapter: str | None = None
    # Before round 0 collects, stop unless the endpoint serves the model the trainer trains: its
    # /v1/models root and its prompt_token_ids of a rendered chat (wharf/core/model_identity.py).
    # false: only for a stand-in endpoint whose tokens are not the model's (the tests' stub).
    check_model: bool = True

    def __post_init__(self):
        if self.eval_dataset is not None:
            self.eval_dataset = bundled.resolve(self.eval_dataset, "loop.eval_dataset")
        if self.init_adapter is not None:
            check_policy_spec(self.init_adapter, "loop.init_adapter")
            if self.init_adapter == "base" or self.init_adapter.endswith(":0"):
                raise ValueError(f"loop.init_adapter={self.init_adapter!r} names the base model: leave it unset")
        if self.eval_every and not self.eval_dataset:
            raise ValueError(f"loop.eval_every={self.eval_every} needs loop.eval_dataset: the task set to evaluate "
                             "on (a held-out split, e.g. datasets/multiturn/heldout)")
