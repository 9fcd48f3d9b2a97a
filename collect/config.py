"""Run configuration: YAML files with `key=value` overrides, checked against typed dataclasses.

One file configures a whole run; each stage reads the sections it needs. The loader refuses
unknown keys and wrong types, naming the file and the dotted key, so a typo never silently
does nothing.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config file or override that does not fit the schema."""


@dataclass
class EngineConfig:
    """The local engine: a Hugging Face causal LM behind vLLM's HTTP API."""

    host: str = "127.0.0.1"
    port: int = 8100
    # A local HF model directory; None serves the embedded SmolLM2-135M-Instruct.
    model: str | None = None
    served_name: str = "smollm2-135m"
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "float32"  # fp32 is faster than bf16 on this kind of CPU
    max_model_len: int = 2048
    max_batch: int = 16
    max_loras: int = 4
    threads: int = 0  # torch threads; 0 keeps torch's default
    seed: int = 0


@dataclass
class EndpointConfig:
    """The OpenAI-compatible endpoint the proxy forwards to."""

    kind: str = "local"  # local (our engine) | vllm
    url: str = "http://127.0.0.1:8100"
    model: str = "smollm2-135m"  # base model name as served
    api_key: str = "EMPTY"
    # Start the endpoint if nothing answers at `url` (local engine, or `vllm serve`).
    launch: bool = True
    vllm_args: list[str] = field(default_factory=list)
    startup_timeout_s: float = 900.0


@dataclass
class SamplingConfig:
    """Forced on every upstream call by the proxy; the trainer divides logits by `temperature`."""

    temperature: float = 1.0
    top_p: float = 1.0
    # Upper bound on max_tokens per call; None leaves the agent's value alone.
    max_tokens: int | None = None
    # Set: each call is sampled with a seed derived from (seed, round, task, attempt, turn), so a
    # round can be re-collected call for call (vLLM and the local engine honour per-request seeds;
    # batching can still flip a near-tie). None: the endpoint's own randomness.
    seed: int | None = None


@dataclass
class ProxyConfig:
    host: str = "127.0.0.1"
    port: int = 8200
    admin_token: str = "wharf-admin"
    # Extra upstream URLs; the endpoint's url is always the first.
    upstreams: list[str] = field(default_factory=list)
    max_body_bytes: int = 16 * 1024 * 1024
    upstream_timeout_s: float = 900.0
    shard_rows: int = 2000
    shard_bytes: int = 64 * 1024 * 1024
    shard_seconds: float = 30.0
    health_interval_s: float = 5.0
    # Where turns shards go; None: <run_dir>/rounds/<round>/collect/turns.
    out_dir: str | None = None
    # WAL segments and the rollout registry; None: <out_dir>/_wal.
    wal_dir: str | None = None
    # fsync every WAL record (survives power loss, not only a killed process); costly per call.
    wal_fsync: bool = False
    # Base of the URLs handed to agents (e.g. http://host-ip:8200 when host is 0.0.0.0).
    public_url: str | None = None


@dataclass
class CollectConfig:
    dataset: str = "datasets/toy"
    tasks: list[str] = field(default_factory=list)  # empty: every task in the dataset
    attempts: int = 4
    concurrency: int = 2
    # A harbor agent name (mini-swe-agent, terminus-2, ...) or an import path module:Class.
    agent: str = "collect.agents.minimal:MinimalAgent"
    agent_kwargs: dict[str, Any] = field(default_factory=dict)
    agent_env: dict[str, str] = field(default_factory=dict)
    # A harbor environment type (docker, daytona, modal, ...) or an import path module:Class.
    environment: str = "collect.sandbox.bwrap:BwrapEnvironment"
    environment_kwargs: dict[str, Any] = field(default_factory=dict)
    agent_timeout_s: float | None = None  # None: the task's own timeout
    verifier_timeout_s: float | None = None
    # The model name to sample from this round (an adapter name); None: endpoint.model.
    policy: str | None = None


@dataclass
class ConvertConfig:
    """Stored collect dirs -> training rows -> advantages -> micro-batches (python -m convert)."""

    # Stored collect dirs to read (replay, mixing); empty: this run's rounds/<round>/collect.
    jobs: list[str] = field(default_factory=list)
    # Where micro-batches go; None: this run's rounds/<round>/convert.
    out_dir: str | None = None
    # Group-relative advantage: grpo ((r - mean) / (std + std_eps)), dr_grpo (r - mean), rloo
    # (leave-one-out mean), or zero (a control run: the groups grpo keeps, every advantage 0).
    advantage: str = "grpo"
    std_eps: float = 1e-6
    # Reward of a policy-side failure that has none (agent crashed before the verifier ran);
    # None leaves such rollouts out. infra_error/verifier_error rollouts are always left out.
    null_reward: float | None = 0.0
    # Rows longer than this are truncated (the overflow is cut, so never trained on) or dropped.
    max_seq_len: int = 4096
    overlong: str = "truncate"  # truncate | drop
    # finish_reason=length completions: keep (trained on) or mask (kept as context, loss 0).
    length_completions: str = "keep"
    # Padded tokens (rows x padded length) per micro-batch; rows are bucketed by length under it.
    max_tokens_per_batch: int = 16384
    pad_multiple: int = 16  # padded length rounded up to a multiple of this
    # A row joins a micro-batch only if at most this share of it would be padding (1.0: fill
    # every micro-batch up to the budget whatever the lengths).
    max_row_padding: float = 0.25
    seed: int = 0  # same seed, same micro-batches in the same order
    # Bad input (corrupt shard, foreign file, log-prob length mismatch): false stops with an
    # error and writes nothing; true skips it and lists it in stats.json.
    skip_bad: bool = False


@dataclass
class TrainConfig:
    """LoRA GRPO on convert's micro-batches (python -m train)."""

    # The base model: a local HF dir; None: the endpoint's base (engine.model, else the embedded one).
    model: str | None = None
    seed: int = 0


@dataclass
class RunConfig:
    name: str = "default"
    runs_dir: str = "runs"
    round: int = 0
    rounds: int = 1
    engine: EngineConfig = field(default_factory=EngineConfig)
    endpoint: EndpointConfig = field(default_factory=EndpointConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    convert: ConvertConfig = field(default_factory=ConvertConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.name

    def round_dir(self, k: int | None = None) -> Path:
        return self.run_dir / "rounds" / str(self.round if k is None else k)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against the annotation `tp`; ints are accepted where floats are expected."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: expected {_type_name(tp)}, got {value!r}")
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping of {tp.__name__} keys, got {value!r}")
        return _build(tp, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        _, vt = typing.get_args(tp)
        return {str(k): _coerce(v, vt, f"{where}.{k}") for k, v in value.items()}
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float) and isinstance(value, bool):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
    if tp in (int, float, str, bool) and not isinstance(value, tp):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def _build(cls: type, data: dict, prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        where = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(names)}"
            raise ConfigError(f"unknown key '{where}'{hint}")
        kwargs[key] = _coerce(value, hints[key], where)
    return cls(**kwargs)


def _deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def parse_override(text: str) -> dict:
    """`collect.attempts=8` -> {"collect": {"attempts": 8}}; the value is read as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}': expected key=value, e.g. collect.attempts=8")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override '{text}': empty key")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override '{text}': value is not valid YAML ({e})") from None
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def load_config(path: str | Path | None, overrides: list[str] = (), cls: type = RunConfig) -> Any:
    """Read `path` (None: defaults only), apply overrides, and validate the result."""
    data: dict = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigError(f"{path}: cannot read config ({e.strerror})") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    for text in overrides:
        data = _deep_merge(data, parse_override(text))
    try:
        return _build(cls, data)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def dump_config(cfg: Any, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def cli_config(argv: list[str] | None, prog: str, cls: type = RunConfig) -> Any:
    """`--config FILE key=value ...` as every stage's entry point takes it; exits 2 on a bad config."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--config", default=None, help="YAML config file (default: built-in defaults)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. collect.attempts=8")
    args = parser.parse_args(argv)
    try:
        return load_config(args.config, args.overrides, cls)
    except ConfigError as e:
        print(f"{prog}: bad config: {e}", file=sys.stderr)
        raise SystemExit(2) from None
