"""The config sections of the stages: collect, convert (and its SFT rows) and train."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field

from wharf.core import bundled, legacy
from wharf.core.config_types import Advantage, Device, Fraction, NonNegative, NonNegativeFloat, Positive, PositiveFloat


@dataclass
class CollectConfig:
    dataset: str = "datasets/toy"
    tasks: list[str] = field(default_factory=list)  # empty: every task in the dataset
    attempts: Positive = 4
    concurrency: Positive = 2
    # A harbor agent name (mini-swe-agent, terminus-2, ...) or an import path module:Class.
    agent: str = "wharf.collect.agents.minimal:MinimalAgent"
    agent_kwargs: dict[str, Any] = field(default_factory=dict)
    agent_env: dict[str, str] = field(default_factory=dict)
    # A harbor environment type (docker, daytona, modal, ...) or an import path module:Class.
    environment: str = "wharf.collect.sandbox.bwrap:BwrapEnvironment"
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
    # Seconds a trial may take on a node before it counts as hung: it runs again on another node,
    # and the node is retired as a failed one is (wharf/collect/ray_blame.py). None: the agent's
    # timeout plus the verifier's plus 600 s (wharf.collect.ray_executor.trial_timeout_s).
    ray_trial_timeout_s: PositiveFloat | None = None

    def __post_init__(self):
        self.dataset = bundled.resolve(self.dataset, "collect.dataset")  # datasets/toy from any directory
        self.agent = legacy.modern_ref(self.agent)
        self.environment = legacy.modern_ref(self.environment)


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
    # The base model, which must be the served one (wharf/core/model_identity.py): None follows the
    # served model's key (engine.model for the local engine, endpoint.model for vLLM); set (a local
    # HF dir, or a hub id in the local Hugging Face cache), it is refused unless it is that model.
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
    kl_coef: NonNegativeFloat = 0.0  # k3 KL to kl_ref's policy; 0 skips the extra forward
    # The KL's reference policy: base (the adapter disabled), or start: the run's start policy,
    # loop.init_adapter's adapter held frozen beside the trained one (the base when unset). A warm
    # start wants start: a KL to the base pulls the policy away from what SFT taught it.
    kl_ref: Literal["base", "start"] = "base"
    # Train/inference mismatch: tis (per-token ratio to the behaviour policy capped at mismatch_cap),
    # mask (drop rows whose mean |log-ratio| exceeds mismatch_bound), none.
    mismatch: Literal["tis", "mask", "none"] = "tis"
    mismatch_cap: PositiveFloat = 2.0
    mismatch_bound: PositiveFloat = 0.5
    logprob_chunk: Positive = 1024  # positions per lm_head chunk (no [B, T, V] fp32 tensor)
    grad_checkpointing: bool = False  # recompute decoder layers in backward (memory for time)
    # On a CPU in fp32, the frozen base weights' matmuls (forward and the input gradient) on the C
    # kernel the engine uses (wharf/core/cpu_linear.py: ~1.6-2x torch's here); torch's where no cc.
    cpu_kernel: bool = True
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"  # accelerate's; fp32 is faster on this CPU
    # The frozen base weights' dtype. auto follows mixed_precision (bf16 -> bfloat16, fp16 ->
    # float16, no -> float32): autocast runs the matmuls in that dtype anyway, so a float32 copy
    # only doubles the memory (16 GB for an 8B model). The LoRA weights stay float32.
    base_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: Device = "auto"  # accelerate picks the process's device under launch
    checkpoint_every: NonNegative = 1  # optimizer steps between checkpoints (0: only at the end)
    # Trackers that get every step's and every round's metrics (wharf/core/tracking.py), each in
    # runs/<run>/trackers/; each needs its package: pip install -e '.[track]'.
    log_with: list[Literal["tensorboard", "mlflow", "wandb"]] = field(default_factory=list)
    publish: bool = True  # load the adapter into the endpoint as policy-v<k+1> after training

    @property
    def base_torch_dtype(self) -> str:
        """base_dtype with auto resolved: the dtype name load_model takes."""
        if self.base_dtype != "auto":
            return self.base_dtype
        return {"bf16": "bfloat16", "fp16": "float16"}.get(self.mixed_precision, "float32")

    def __post_init__(self):
        if self.lora_rank > self.max_lora_rank:  # checked at load time: pydantic names the section
            raise ValueError(f"train.lora_rank={self.lora_rank} is above train.max_lora_rank={self.max_lora_rank} "
                             "(the endpoint's --max-lora-rank): lower the rank or raise the limit")
        if not self.lora_target_modules:
            raise ValueError("train.lora_target_modules is empty: name the linear layers to adapt, e.g. q_proj")
