"""Run configuration: one YAML file per run, `key=value` overrides, typed dataclass sections.

One file configures a whole run; each stage reads the sections it needs. The loader
(wharf/core/configio.py) refuses unknown keys, wrong types and values out of range, naming the
file and the dotted key, so a typo never silently does nothing. A range is written on the
field: `Annotated[int, Field(ge=1)]`.

The sections live beside it, by who reads them: wharf/core/config_serving.py (engine, endpoint,
sampling, proxy), wharf/core/config_stages.py (collect, convert, train), wharf/core/config_loop.py (loop
and its health checks, eval); their value types in wharf/core/config_types.py.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from wharf.core import configio
from wharf.core.config_loop import EvalConfig, HealthConfig, LoopConfig, check_policy_spec, policies_loaded  # noqa: F401
from wharf.core.config_serving import EndpointConfig, EngineConfig, ProxyConfig, SamplingConfig  # noqa: F401
from wharf.core.config_stages import CollectConfig, ConvertConfig, SftConvertConfig, TrainConfig  # noqa: F401
from wharf.core.config_types import NonNegative, Positive
from wharf.core.configio import ConfigError, parse_override  # noqa: F401  (the loader's public names)
from wharf.core.layout import RoundLayout, RunLayout


@dataclass
class RunConfig:
    name: str = "default"
    runs_dir: str = "runs"
    round: NonNegative = 0
    # Rounds the loop runs (wharf/pipeline/loop.py; `make loop ROUNDS=N` sets it); running again with a
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

    def check_paths(self) -> None:
        """runs_dir and the run's dir under it: each a directory or not there yet (a command line's
        check, before anything is written; validation itself reads no disk)."""
        if "://" in self.runs_dir:
            return
        for d in (Path(self.runs_dir) / self.name, *(Path(self.runs_dir) / self.name).parents):
            if d.exists() and not d.is_dir():
                raise ConfigError(f"runs_dir={self.runs_dir}, name={self.name}: {d} is a file, not a directory")

    @property
    def run_dir(self) -> Path:
        return self.layout.root

    @property
    def start_policy(self) -> str:
        """The name round 0 samples from: the endpoint's model, or policy-v0 (loop.init_adapter)."""
        return self.policy(0) if self.loop.init_adapter else self.endpoint.model

    def policy(self, k: int) -> str:
        """policy-v<k> of this run as its replicas serve it (`<run>-<h>-policy-v<k>`: per run on a shared fleet)."""
        return self.layout.policy(k)

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


# The top-level keys each command reads: what its `--help` lists (`wharf loop --help`: all of them).
RUN_KEYS = ("name", "runs_dir", "round")
SERVING = ("engine", "endpoint", "sampling")
COMMAND_KEYS = {
    "serve": ("engine",),
    "chat": (*SERVING, "proxy"),
    "proxy": (*RUN_KEYS, "endpoint", "sampling", "proxy"),
    "collect": (*RUN_KEYS, *SERVING, "proxy", "collect"),
    "convert": (*RUN_KEYS, "engine", "convert", "train"),
    "train": (*RUN_KEYS, "engine", "endpoint", "proxy", "convert", "train", "loop"),
    "publish": (*RUN_KEYS, "engine", "endpoint", "proxy", "train", "loop"),
    "eval": (*RUN_KEYS, *SERVING, "proxy", "collect", "eval"),
    "replay": ("name", "runs_dir", "engine", "convert", "train"),
}


def cli_config(argv: list[str] | None, prog: str, description: str = "", cls: type = RunConfig) -> Any:
    """`--config FILE key=value ...` as every stage's entry point takes it; `--help` lists the keys
    the command reads (COMMAND_KEYS; every key for one not there); exits 2 on a bad config."""
    sections = COMMAND_KEYS.get(prog.split()[-1]) if cls is RunConfig else None
    return configio.cli(argv, prog, cls, description, sections)
