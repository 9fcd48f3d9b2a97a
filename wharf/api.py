"""wharf from Python: the stages as functions, for notebooks and scripts (docs/api.md).

    from wharf import api
    result = api.collect("default", {"collect.tasks": ["write-hello"], "collect.attempts": 2})
    result.mean_reward, result.collect_dir

Each function takes a config as a RunConfig, a dict (what a YAML file holds), a YAML path or the
name of a config wharf carries ("default"), or None (the built-in defaults, as a command without
--config), plus overrides (`["collect.attempts=2"]` as on the command line, or a dict of dotted
keys), and returns a typed record (wharf/pipeline/results.py). A bad config raises ConfigError, a
stage that cannot go on a WharfError, each with the one line the command would print.

Called inside a running event loop (Jupyter), a function runs in a worker thread of its own (the
stages start event loops of their own) and blocks until it is done; `await api.acollect(...)` and
the other a-prefixed forms leave the loop free meanwhile. Importing this module loads only the
config; each stage loads when it is first called.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar, Union

from typing import TYPE_CHECKING

from wharf.core import envdefaults
from wharf.core.errors import WharfError  # noqa: F401  (what a stage that cannot go on raises)

if TYPE_CHECKING:
    from wharf.core.config import RunConfig

ConfigLike = Union["RunConfig", Mapping[str, Any], str, Path, None]
Overrides = Union[Sequence[str], Mapping[str, Any]]
T = TypeVar("T")


def __getattr__(name: str):
    if name == "ConfigError":  # what a bad config raises; its module (pydantic) loads on first use
        from wharf.core.configio import ConfigError
        return ConfigError
    raise AttributeError(f"module 'wharf.api' has no attribute {name!r}")


def config(source: ConfigLike = None, overrides: Overrides = ()) -> "RunConfig":
    """A validated RunConfig from any of the forms the stage functions take."""
    from wharf.core import configio
    from wharf.core.config import RunConfig, load_config

    ovr = _override_texts(overrides)
    if isinstance(source, RunConfig):
        return configio.load_data(RunConfig, dataclasses.asdict(source), ovr, "config object")
    if isinstance(source, Mapping):
        return configio.load_data(RunConfig, dict(source), ovr, "config dict")
    return load_config(source, ovr)


def _override_texts(overrides: Overrides) -> list[str]:
    """`{"collect.attempts": 2}` -> ["collect.attempts=2"] (the value written as YAML reads it)."""
    if isinstance(overrides, str):
        from wharf.core.configio import ConfigError
        raise ConfigError(f"overrides: a list of key=value strings or a dict, not the string {overrides!r}")
    if not isinstance(overrides, Mapping):
        return list(overrides)
    import json

    return [f"{key}={json.dumps(value)}" for key, value in overrides.items()]  # JSON is YAML


def _blocking(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn` as a plain call; inside a running event loop, in a thread with none (asyncio.run works there)."""
    @functools.wraps(fn)
    def call(*args, **kwargs) -> T:
        envdefaults.apply()  # before a stage imports torch or harbor, as every command does
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return fn(*args, **kwargs)
        out: dict[str, Any] = {}

        def work():
            try:
                out["value"] = fn(*args, **kwargs)
            except BaseException as e:  # re-raised in the caller's thread
                out["error"] = e
        # one thread for the whole call: the children it starts (engine, proxy) are bound to it
        worker = threading.Thread(target=work, name=f"wharf-{fn.__name__}")
        worker.start()
        worker.join()
        if "error" in out:
            raise out["error"]
        return out["value"]
    return call


def _awaitable(fn: Callable[..., T]) -> Callable[..., Any]:
    async def call(*args, **kwargs) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs)
    call.__name__ = call.__qualname__ = f"a{fn.__name__}"
    call.__doc__ = f"`await` form of {fn.__name__}: runs in a worker thread, the event loop stays free."
    return call


@_blocking
def collect(source: ConfigLike = None, overrides: Overrides = (), progress: bool = False):
    """One collect round (`wharf collect`) -> CollectResult."""
    from wharf.collect.runner import run
    from wharf.pipeline.results import CollectResult

    cfg = config(source, overrides)
    return CollectResult.of(run(cfg, progress=progress), cfg.round_layout.collect)


@_blocking
def convert(source: ConfigLike = None, overrides: Overrides = (), progress: bool = False):
    """Round `round`'s collect dir (or convert.jobs) -> micro-batches (`wharf convert`) -> ConvertResult."""
    from wharf.convert.stage import convert_round, out_paths
    from wharf.pipeline.results import ConvertResult

    cfg = config(source, overrides)
    return ConvertResult.of(convert_round(cfg, progress=progress), out_paths(cfg).root)


@_blocking
def train(source: ConfigLike = None, overrides: Overrides = (), progress: bool = False):
    """LoRA training on round `round`'s micro-batches, convert first when they are missing, then
    publication when an endpoint answers (`wharf train`) -> wharf.train.records.TrainResult."""
    from wharf.convert.stage import convert_round
    from wharf.train.stage import train_round

    return train_round(config(source, overrides), progress=progress, convert=convert_round)


@_blocking
def loop(source: ConfigLike = None, overrides: Overrides = ()):
    """collect -> convert -> train -> publish, `rounds` times; resumes (`wharf loop`) -> LoopResult."""
    from wharf.pipeline.loop import run_loop
    from wharf.pipeline.results import LoopResult

    cfg = config(source, overrides)
    return LoopResult.of(cfg.layout, run_loop(cfg))


@_blocking
def eval(source: ConfigLike = None, overrides: Overrides = ()):  # noqa: A001  (the command's name)
    """eval.policies side by side on eval.dataset (`wharf eval`) -> EvalResult."""
    from wharf.pipeline.eval import eval_name, run_eval
    from wharf.pipeline.results import EvalResult

    cfg = config(source, overrides)
    summary = run_eval(cfg)
    return EvalResult.of(summary, cfg.layout.eval(eval_name(cfg)).summary)


@_blocking
def import_(out: str | Path, inputs: Sequence[str | Path], reward: float | None = None, task: str | None = None):
    """Trajectory files (ATIF, mini-swe-agent) -> a collect dir `out` of text-only rows (`wharf import`)
    -> ImportResult."""
    from wharf.collect.importers import import_trajectories
    from wharf.pipeline.results import ImportResult

    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    out = Path(out)
    return ImportResult.of(import_trajectories([Path(p) for p in inputs], out, reward, task), out)


@_blocking
def demo(source: ConfigLike = "default", overrides: Overrides = (), progress: bool = False):
    """`wharf demo`: one collect round (default: the carried configs/default.yaml on the bundled toy
    tasks), then its token-exactness audit -> DemoResult."""
    from wharf.pipeline.demo import run_demo

    return run_demo(config(source, overrides), progress=progress)


acollect, aconvert, atrain, aloop, aeval, aimport_, ademo = map(
    _awaitable, (collect, convert, train, loop, eval, import_, demo))
