"""What `wharf loop` checks before it writes or starts anything, cheapest first (wharf/pipeline/loop.py
runs it first): the rounds, the datasets and tasks, the agent and environment classes, the start
adapter, then the endpoint."""
from __future__ import annotations

from wharf.collect.runner import check_collect
from wharf.collect.tasksets import TaskSetError, discover
from wharf.core import tracking
from wharf.core.config import ConfigError, RunConfig
from wharf.core.layout import has_adapter, init_adapter_dir
from wharf.core.model_identity import ModelRef, trained_model
from wharf.engine.launch import check_endpoint
from wharf.train.model import AdapterError, check_adapter_config

from .stages import LoopError


def check_init_adapter(cfg: RunConfig) -> None:
    """loop.init_adapter, before anything samples from it: an adapter this run's train can continue."""
    start = init_adapter_dir(cfg.loop.init_adapter)
    if start is None:
        return
    if not has_adapter(start):
        raise LoopError(f"loop.init_adapter={cfg.loop.init_adapter!r}: {start} holds no adapter "
                        "(no adapter_config.json)")
    try:
        check_adapter_config(cfg, start)
    except AdapterError as e:
        raise LoopError(f"loop.init_adapter={cfg.loop.init_adapter!r}: {e}") from None


def check_loop(cfg: RunConfig) -> ModelRef:
    """Everything the loop can check cheaply, before it writes or starts anything (an endpoint
    takes seconds, vLLM minutes): the rounds, the datasets and tasks, the agent and environment
    classes, the start adapter, the model (one per run), the trackers' packages, then the endpoint
    (one not ours to start must answer). Returns the model the run trains."""
    if cfg.rounds < 1:
        raise LoopError(f"rounds={cfg.rounds}: the loop needs at least one round (set rounds=N)")
    check_collect(cfg)
    if cfg.loop.eval_every:
        try:
            discover(cfg.loop.eval_dataset)
        except TaskSetError as e:
            raise ConfigError(f"loop.eval_dataset: {str(e).removeprefix('collect.dataset: ')}") from None
    check_init_adapter(cfg)
    trained = trained_model(cfg)  # one model per run: a train.model the endpoint does not serve stops here
    tracking.check(cfg.train.log_with)  # a tracker whose package is missing
    check_endpoint(cfg)
    return trained
