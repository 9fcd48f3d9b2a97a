"""Run configuration: one YAML file per run, `key=value` overrides, typed dataclass sections.

One file configures a whole run; each stage reads the sections it needs. The loader
(wharf/configio.py) refuses unknown keys, wrong types and values out of range, naming the
file and the dotted key, so a typo never silently does nothing. A range is written on the
field: `Annotated[int, Field(ge=1)]`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence

from pydantic import AfterValidator, Field

from wharf import configio
from wharf.configio import ConfigError, parse_override  # noqa: F401  (the loader's public names)
from wharf.layout import RoundLayout, RunLayout, policy_name

Port = Annotated[int, Field(ge=0, le=65535)]  # 0: any free port
Positive = Annotated[int, Field(ge=1)]
PositiveFloat = Annotated[float, Field(gt=0)]
Probability = Annotated[float, Field(gt=0, le=1)]
NonNegative = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Device = Literal["auto", "cpu", "cuda"]
# The group-relative advantage estimators (convert/advantages.py implements each).
Advantage = Literal["grpo", "dr_grpo", "rloo", "zero"]


def _secret(value: str) -> str:
    # An empty token would let requests with no credentials through.
    if not value.strip():
        raise ValueError("empty: leave it unset (null) for a random one per run, or give a non-empty secret")
    return value


Secret = Annotated[str, AfterValidator(_secret)]


@dataclass
class EngineConfig:
    """The local engine: a Hugging Face causal LM behind vLLM's HTTP API."""

    host: str = "127.0.0.1"
    port: Port = 8100
    # A local HF model directory; None serves the embedded SmolLM2-135M-Instruct.
    model: str | None = None
    served_name: str = "smollm2-135m"
    device: Device = "auto"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # fp32 is faster than bf16 on this kind of CPU
    max_model_len: Positive = 2048
    max_batch: Positive = 32  # 32 concurrent requests: ~1.1-1.2x the tok/s of 16 (bench.engine)
    max_loras: Positive = 4
    # Adapters kept merged into a copy of the adapted weights (LRU): a batch on one adapter runs
    # at the base's speed. Each costs the adapted layers' size (~0.4 GB fp32 for SmolLM2-135M).
    merged_loras: NonNegative = 2
    threads: NonNegative = 0  # torch threads; 0 keeps torch's default
    seed: int = 0
    # Reuse the KV of prompt prefixes already computed (other attempts of a task, the previous
    # call of a rollout), per adapter, least recently used dropped beyond prefix_cache_mib.
    # SmolLM2-135M's KV is ~45 KiB a token in fp32: 1024 MiB holds ~23k tokens.
    prefix_cache: bool = True
    prefix_cache_mib: NonNegative = 1024
    # Required as `Authorization: Bearer KEY` on every /v1 route (as vLLM's --api-key); /health,
    # /tokenize stay open. None: open, unless a run launches it (then a random key per run).
    api_key: Secret | None = None


@dataclass
class EndpointConfig:
    """The OpenAI-compatible endpoint the proxy forwards to."""

    kind: Literal["local", "vllm"] = "local"  # local: our engine
    url: str = "http://127.0.0.1:8100"
    model: str = "smollm2-135m"  # base model name as served
    # Sent as `Authorization: Bearer KEY`. None: none sent, and an endpoint a run launches
    # itself gets a random key per run (the engine's api_key, vLLM's VLLM_API_KEY).
    api_key: Secret | None = None
    # Start the endpoint if nothing answers at `url` (local engine, or `vllm serve`).
    launch: bool = True
    vllm_args: list[str] = field(default_factory=list)
    startup_timeout_s: PositiveFloat = 900.0


@dataclass
class SamplingConfig:
    """Forced on every upstream call by the proxy; the trainer divides logits by `temperature`."""

    # > 0: greedy decoding (0) reports log-probs of no distribution the trainer can recompute.
    temperature: PositiveFloat = 1.0
    # < 1 samples from a truncated distribution while the trainer scores the full softmax (no
    # correction): refused unless top_p_uncorrected is true.
    top_p: Probability = 1.0
    top_p_uncorrected: bool = False
    # Upper bound on max_tokens per call; None leaves the agent's value alone.
    max_tokens: Positive | None = None
    # Set: each call is sampled with a seed derived from (seed, round, task, attempt, turn), so a
    # round can be re-collected call for call (vLLM and the local engine honour per-request seeds;
    # batching can still flip a near-tie). None: the endpoint's own randomness.
    seed: int | None = None

    def __post_init__(self):
        if self.top_p < 1 and not self.top_p_uncorrected:
            raise ValueError(f"sampling.top_p={self.top_p} samples a truncated distribution the trainer does not "
                             "reproduce (it scores the full softmax); use top_p: 1.0, or set "
                             "sampling.top_p_uncorrected: true to train on it anyway")


@dataclass
class ProxyConfig:
    host: str = "127.0.0.1"
    port: Port = 8200
    # Bearer token of the admin API; None: a random one per run, written with the admin URL to
    # <wal_dir>/admin.json (mode 0600).
    admin_token: Secret | None = None
    # The admin API's own listener, never the agents' one (which answers 404 under /admin).
    admin_host: str = "127.0.0.1"
    admin_port: Port = 0  # 0: any free port (admin.json says which)
    # Extra upstream URLs; the endpoint's url is always the first.
    upstreams: list[str] = field(default_factory=list)
    # {policy: [upstream urls]} that refused to load the policy: none of its calls go there. A round
    # fills it from what publishing recorded (runs/<run>/published/<policy>.json).
    refused: dict[str, list[str]] = field(default_factory=dict)
    max_body_bytes: Positive = 16 * 1024 * 1024
    upstream_timeout_s: PositiveFloat = 900.0
    shard_rows: Positive = 2000
    shard_bytes: Positive = 64 * 1024 * 1024
    shard_seconds: NonNegativeFloat = 30.0  # 0: no time-based flush
    health_interval_s: NonNegativeFloat = 5.0  # 0: no background health checks
    # Where turns shards go; None: <run_dir>/rounds/<round>/collect/turns.
    out_dir: str | None = None
    # WAL segments and the rollout registry; None: <out_dir>/_wal.
    wal_dir: str | None = None
    # Answer a call only once its WAL record is fsynced (group commit: one fsync per batch of calls in
    # flight), so an answered call survives a power cut. false: survives a killed proxy only.
    wal_fsync: bool = True
    # Base of the URLs handed to agents (e.g. http://host-ip:8200 when host is 0.0.0.0).
    public_url: str | None = None
    # The upstream's context window, to cap an agent's max_tokens to the room its prompt leaves;
    # None: learned from the upstream's /tokenize (vLLM and the local engine report it).
    max_model_len: Positive | None = None
    # The upstream is a teacher that returns no token ids or log-probs (an API model, llama.cpp,
    # ollama): vLLM's recording parameters are not sent, the request and the answer's text are
    # recorded, and the calls are marked text_only (usable by convert.mode=sft, refused by grpo).
    text_only: bool = False


@dataclass
class CollectConfig:
    dataset: str = "datasets/toy"
    tasks: list[str] = field(default_factory=list)  # empty: every task in the dataset
    attempts: Positive = 4
    concurrency: Positive = 2
    # A harbor agent name (mini-swe-agent, terminus-2, ...) or an import path module:Class.
    agent: str = "collect.agents.minimal:MinimalAgent"
    agent_kwargs: dict[str, Any] = field(default_factory=dict)
    agent_env: dict[str, str] = field(default_factory=dict)
    # A harbor environment type (docker, daytona, modal, ...) or an import path module:Class.
    environment: str = "collect.sandbox.bwrap:BwrapEnvironment"
    environment_kwargs: dict[str, Any] = field(default_factory=dict)
    agent_timeout_s: PositiveFloat | None = None  # None: the task's own timeout
    verifier_timeout_s: PositiveFloat | None = None
    # The model name to sample from this round (an adapter name); None: endpoint.model.
    policy: str | None = None
    # Where the trials run: local (here, one proxy) or ray (over a Ray cluster's nodes, a proxy
    # per node; needs the ray extra: pip install -e '.[ray]').
    executor: Literal["local", "ray"] = "local"
    # What ray.init takes (e.g. 10.0.0.5:6379 or auto); None: RAY_ADDRESS, else a local cluster.
    ray_address: str | None = None
    # Seconds a node's trial actor may take to start. The round starts with the first node up and
    # others join as they start; one not started by then (its CPUs held by other Ray work) is left
    # out of the round and named. The round waits this long only when no node is up at all.
    ray_ready_timeout_s: PositiveFloat = 120.0
    # Seconds a trial may take on a node before the node counts as hung: it is taken out and its
    # trials run on the others (None: no bound; harbor's own agent and verifier timeouts apply).
    ray_trial_timeout_s: PositiveFloat | None = None


@dataclass
class SftConvertConfig:
    """convert.mode=sft: which rollouts become supervised rows."""

    # Rollouts whose reward is at least this are kept (demonstrations that succeeded).
    min_reward: float = 1.0


@dataclass
class ConvertConfig:
    """Stored collect dirs -> training rows -> advantages -> micro-batches (wharf convert)."""

    # grpo: group advantages, token-exact rows only (text-only calls are refused). sft: supervised
    # rows of the rollouts with reward >= sft.min_reward (advantage 1, scored at temperature 1);
    # text-only calls are rendered with the student's chat template as the engine renders them.
    mode: Literal["grpo", "sft"] = "grpo"
    sft: SftConvertConfig = field(default_factory=SftConvertConfig)

    # Stored collect dirs to read (replay, mixing); empty: this run's rounds/<round>/collect.
    jobs: list[str] = field(default_factory=list)
    # Where micro-batches go; None: this run's rounds/<round>/convert.
    out_dir: str | None = None
    # Group-relative advantage: grpo ((r - mean) / (std + std_eps)), dr_grpo (r - mean), rloo
    # (leave-one-out mean), or zero (a control run: the groups grpo keeps, every advantage 0).
    advantage: Advantage = "grpo"
    std_eps: PositiveFloat = 1e-6
    # Reward of a policy-side failure that has none (agent crashed before the verifier ran);
    # None leaves such rollouts out. infra_error/verifier_error rollouts are always left out.
    null_reward: float | None = 0.0
    # Rows longer than this are truncated (the overflow is cut, so never trained on) or dropped.
    max_seq_len: Positive = 4096
    overlong: Literal["truncate", "drop"] = "truncate"
    # finish_reason=length completions (cut at max_tokens): mask (kept as context, loss 0) or
    # keep (trained on, the cut included).
    length_completions: Literal["mask", "keep"] = "mask"
    # context_exceeded rollouts: mask (their reward counts in the group, their tokens are not
    # trained: the context limit ended them) or keep (trained as the policy's failures).
    context_exceeded: Literal["mask", "keep"] = "mask"
    # Padded tokens (rows x padded length) per micro-batch; rows are bucketed by length under it.
    max_tokens_per_batch: Positive = 16384
    pad_multiple: Positive = 16  # padded length rounded up to a multiple of this
    # A row joins a micro-batch only if at most this share of it would be padding (1.0: fill
    # every micro-batch up to the budget whatever the lengths).
    max_row_padding: Fraction = 0.25
    seed: int = 0  # same seed, same micro-batches in the same order
    # Bad input (corrupt shard, foreign file, log-prob length mismatch): false stops with an
    # error and writes nothing; true skips it and lists it in stats.json.
    skip_bad: bool = False


@dataclass
class TrainConfig:
    """LoRA GRPO on convert's micro-batches (wharf train)."""

    # grpo: the clipped policy-gradient loss; sft: the mean token NLL over the completion mask
    # (demonstrations: convert.mode=sft), advantages and behaviour log-probs unused.
    objective: Literal["grpo", "sft"] = "grpo"
    # The base model: a local HF dir; None: the endpoint's base (engine.model, else the embedded one).
    model: str | None = None
    seed: int = 0
    # Optimizer (AdamW) and schedule: linear warmup over `warmup` steps, then constant.
    lr: PositiveFloat = 2e-4
    weight_decay: NonNegativeFloat = 0.0
    warmup: NonNegative = 0
    # Round k > 0 resumes round k-1's AdamW moments and step count (saved as train/optimizer.pt
    # beside its adapter), so the warmup runs over the whole run and Adam's first updates are not
    # ~lr x sign(grad) every round. false: a fresh AdamW each round.
    resume_optimizer: bool = True
    # Rows per optimizer step (whole micro-batches are packed until this is reached); 0: all rows.
    rows_per_step: NonNegative = 16
    # Or a budget of loss tokens per optimizer step (0: off); a step ends at whichever comes first.
    tokens_per_step: NonNegative = 0
    epochs: Positive = 1  # passes over the round's micro-batches
    max_grad_norm: NonNegativeFloat = 1.0  # clip the gradient's global norm (0: off)
    # LoRA: vLLM loads attention and MLP projections only (no modules_to_save, no embeddings).
    lora_rank: Positive = 16  # at most max_lora_rank
    lora_alpha: Positive = 32
    lora_dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    lora_target_modules: list[str] = field(default_factory=lambda: [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    max_lora_rank: Positive = 64  # the endpoint's limit (vLLM --max-lora-rank); a larger rank is refused
    # PPO clip of the ratio to the behaviour log-probs: [1 - eps_low, 1 + eps_high] (DAPO clip-higher).
    eps_low: NonNegativeFloat = 0.2
    eps_high: NonNegativeFloat = 0.28
    # token_mean (DAPO) | seq_mean (GRPO) | constant (Dr. GRPO: sum / loss_constant)
    loss_agg: Literal["token_mean", "seq_mean", "constant"] = "token_mean"
    # The constant of `constant`, fixed for the run; 0: sampling.max_tokens x
    # collect.agent_kwargs.max_turns (a rollout's generation budget), refused if either is unset.
    loss_constant: NonNegativeFloat = 0.0
    kl_coef: NonNegativeFloat = 0.0  # k3 KL to the base model (adapter disabled); 0 skips the extra forward
    # Train/inference mismatch: tis (per-token ratio to the behaviour policy capped at mismatch_cap),
    # mask (drop rows whose mean |log-ratio| exceeds mismatch_bound), none.
    mismatch: Literal["tis", "mask", "none"] = "tis"
    mismatch_cap: PositiveFloat = 2.0
    mismatch_bound: PositiveFloat = 0.5
    logprob_chunk: Positive = 1024  # positions per lm_head chunk (no [B, T, V] fp32 tensor)
    grad_checkpointing: bool = False  # recompute decoder layers in backward (memory for time)
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"  # accelerate's; fp32 is faster on this CPU
    device: Device = "auto"  # accelerate picks the process's device under launch
    checkpoint_every: NonNegative = 1  # optimizer steps between checkpoints (0: only at the end)
    log_with: list[str] = field(default_factory=list)  # accelerate trackers (tensorboard, wandb, ...)
    publish: bool = True  # load the adapter into the endpoint as policy-v<k+1> after training

    def __post_init__(self):
        if self.lora_rank > self.max_lora_rank:  # checked at load time: pydantic names the section
            raise ValueError(f"train.lora_rank={self.lora_rank} is above train.max_lora_rank={self.max_lora_rank} "
                             "(the endpoint's --max-lora-rank): lower the rank or raise the limit")
        if not self.lora_target_modules:
            raise ValueError("train.lora_target_modules is empty: name the linear layers to adapt, e.g. q_proj")


@dataclass
class HealthConfig:
    """The loop's checks after every round (pipeline/health.py); each stops the loop when it fails.
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
    # Every replica the proxy routes to (endpoint.url, proxy.upstreams) took the round's new
    # policy when it was published (one that refused gets none of its calls); false: off.
    all_replicas_serve: bool = True


def policies_loaded(max_staleness: int, evaluates: bool) -> int:
    """Adapters the loop keeps loaded at once: the newest policy and the `max(1, s)` before it (a
    round still sampling; publish unloads older ones), plus a copy while it evaluates."""
    return 1 + max(1, max_staleness) + int(evaluates)


def check_policy_spec(spec: str, key: str) -> str:
    """The forms a policy to evaluate takes (pipeline/eval.py resolves them): `base`, a run's round
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
    # Rounds that overlap (pipeline/overlap.py): 0 collects round k+1 only after policy-v<k+1> is
    # published; s >= 1 collects round k+1 while round k trains, from the newest published policy,
    # so a round's rows are at most s policies behind the one it trains (corrected by train.mismatch).
    max_staleness: Annotated[int, Field(ge=0, le=2)] = 0
    # Warm start: round 0 samples from this adapter (published as policy-v0) and round 0's train
    # continues it, instead of the base model and a new LoRA: <run dir>:<k> (policy-v<k> of that
    # run, e.g. an SFT run's) or an adapter dir. Same base model, rank and targets, checked at start.
    init_adapter: str | None = None

    def __post_init__(self):
        if self.init_adapter is not None:
            check_policy_spec(self.init_adapter, "loop.init_adapter")
            if self.init_adapter == "base" or self.init_adapter.endswith(":0"):
                raise ValueError(f"loop.init_adapter={self.init_adapter!r} names the base model: leave it unset")
        if self.eval_every and not self.eval_dataset:
            raise ValueError(f"loop.eval_every={self.eval_every} needs loop.eval_dataset: the task set to evaluate "
                             "on (a held-out split, e.g. datasets/multiturn/heldout)")


@dataclass
class RunConfig:
    name: str = "default"
    runs_dir: str = "runs"
    round: NonNegative = 0
    # Rounds the loop runs (pipeline/loop.py; `make loop ROUNDS=N` sets it); running again with a
    # larger value continues a finished loop.
    rounds: Positive = 1
    engine: EngineConfig = field(default_factory=EngineConfig)
    endpoint: EndpointConfig = field(default_factory=EndpointConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    convert: ConvertConfig = field(default_factory=ConvertConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self):
        if self.train.loss_agg == "constant" and not self.train.loss_constant and self.rollout_budget() is None:
            raise ValueError("train.loss_agg=constant needs a constant fixed for the run: set train.loss_constant "
                             "(e.g. the completion tokens a rollout may generate), or both sampling.max_tokens and "
                             "collect.agent_kwargs.max_turns (their product is used)")
        need = policies_loaded(self.loop.max_staleness, self.loop.eval_every > 0)
        have, key = self.lora_slots()
        if have is not None and have < need:
            raise ValueError(f"loop.max_staleness={self.loop.max_staleness} keeps up to {need} adapters loaded at once "
                             f"(the policies still sampling, the new one{', an evaluated copy' if self.loop.eval_every else ''}), "
                             f"but {key}={have}: raise it to {need}, or lower loop.max_staleness")

    def lora_slots(self) -> tuple[int | None, str]:
        """How many adapters the endpoint holds at once, and the setting that says so (None: unknown,
        an endpoint wharf does not start)."""
        if self.endpoint.kind == "local":
            return self.engine.max_loras, "engine.max_loras"
        # vLLM swaps adapters beyond --max-loras in from its CPU cache (slow, not refused): checked
        # only when rounds overlap, where two policies sample at once
        if not self.endpoint.launch or self.loop.max_staleness == 0:
            return None, "--max-loras"
        args = self.endpoint.vllm_args
        for i, arg in enumerate(args):
            value = arg.split("=", 1)[1] if arg.startswith("--max-loras=") else \
                args[i + 1] if arg == "--max-loras" and i + 1 < len(args) else None
            if value is not None:
                if not value.isdigit():
                    raise ValueError(f"endpoint.vllm_args: --max-loras {value!r} is not a number")
                return int(value), "vLLM --max-loras (endpoint.vllm_args)"
        return 1, "vLLM --max-loras (its default; endpoint.vllm_args has none)"

    def rollout_budget(self) -> int | None:
        """The tokens one rollout may generate, sampling.max_tokens x collect.agent_kwargs.max_turns;
        None when either is unset."""
        turns = self.collect.agent_kwargs.get("max_turns")
        if self.sampling.max_tokens is None or isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
            return None
        return self.sampling.max_tokens * turns

    @property
    def run_dir(self) -> Path:
        return self.layout.root

    @property
    def start_policy(self) -> str:
        """The name round 0 samples from: the endpoint's model, or policy-v0 (loop.init_adapter)."""
        return policy_name(0) if self.loop.init_adapter else self.endpoint.model

    @property
    def layout(self) -> RunLayout:
        return RunLayout.of(self.runs_dir, self.name)

    @property
    def round_layout(self) -> RoundLayout:
        """This round's directories (`round`)."""
        return self.layout.round(self.round)

    def round_dir(self) -> Path:
        return self.round_layout.root


def load_config(path: str | Path | None, overrides: Sequence[str] = (), cls: type = RunConfig) -> Any:
    """Read `path` (None: defaults only), apply overrides, and validate the result."""
    return configio.load(cls, path, overrides)


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def dump_config(cfg: Any, path: str | Path) -> None:
    configio.dump(cfg, path)


def cli_config(argv: list[str] | None, prog: str, description: str = "", cls: type = RunConfig) -> Any:
    """`--config FILE key=value ...` as every stage's entry point takes it; `--help` lists the keys;
    exits 2 on a bad config."""
    return configio.cli(argv, prog, cls, description)
