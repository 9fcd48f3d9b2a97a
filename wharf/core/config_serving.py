"""The config sections of serving: the local engine, the endpoint, sampling and the recording proxy."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from wharf.core.config_types import Device, NonNegative, NonNegativeFloat, Port, Positive, PositiveFloat, Probability, Secret


@dataclass
class EngineConfig:
    """The local engine: a Hugging Face causal LM behind vLLM's HTTP API."""

    host: str = "127.0.0.1"
    port: Port = 8100
    # A local HF model directory, or a hub id in the local Hugging Face cache (never downloaded);
    # None serves the embedded SmolLM2-135M-Instruct.
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
    # Small C kernels built here: the linear layers (wharf/core/cpu_linear.py: where timed faster than
    # torch's fp32 matmul on this machine; CPU and float32 only), a decode step's layers around
    # attention (wharf/engine/cpu_layer.py: decode steps 1.35-1.9x faster) and the sampling race
    # (wharf/engine/cpu_race.py: torch's very draws, faster); torch's own where there is no cc.
    cpu_kernel: bool = True
    seed: int = 0
    # Reuse the KV of prompt prefixes already computed (other attempts of a task, the previous
    # call of a rollout), per adapter, least recently used dropped beyond prefix_cache_mib.
    # SmolLM2-135M's KV is ~45 KiB a token in fp32: 1024 MiB holds ~23k tokens.
    prefix_cache: bool = True
    prefix_cache_mib: NonNegative = 1024
    # Required as `Authorization: Bearer KEY` on every /v1 route (as vLLM's --api-key); /health,
    # /tokenize stay open. None: open, unless a run launches it (then a random key per run).
    api_key: Secret | None = None
    # How tool calls are read out of the generated text, as vLLM's --tool-call-parser (the
    # formats: wharf/engine/tool_parsers.py). auto: the served model's family's format
    # (wharf/core/families.py) where its chat template renders the tools; hermes where wharf
    # writes the tools block itself (a template without tools, as SmolLM2's).
    tool_parser: Literal["auto", "hermes", "llama3_json", "mistral", "pythonic"] = "auto"


@dataclass
class EndpointConfig:
    """The OpenAI-compatible endpoint the proxy forwards to."""

    kind: Literal["local", "vllm"] = "local"  # local: our engine
    url: str = "http://127.0.0.1:8100"
    # The base model's name as served; for vLLM also what `vllm serve` is given (a dir or hub id)
    # and, with train.model unset, what the trainer loads (wharf/core/model_identity.py).
    model: str = "smollm2-135m"
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
