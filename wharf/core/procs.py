"""Child processes of a round (the endpoint, the proxy): started in their own session so that
stopping one also stops what it spawned, and tied to our life so a killed `make collect`
leaves nothing holding a port.

A child stage gets its config one way: the resolved config written to a YAML file, passed as
`--config FILE` (stage_argv); its environment is envdefaults.child_env()."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

from wharf.core import envdefaults
from wharf.core.config import RunConfig, dump_config

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def stage_argv(module: str, cfg: RunConfig, config_path: Path) -> list[str]:
    """`python -m <module> --config <config_path>`, with `cfg` written there first; the path is
    absolute, so a child started in another directory (the engine: wharf/engine/launch.py) finds it."""
    dump_config(cfg, config_path)
    return [sys.executable, "-m", module, "--config", str(Path(config_path).absolute())]


def spawn(argv: list[str], log_path: Path, env: dict | None = None, cwd: str | Path | None = None) -> subprocess.Popen:
    """Start `argv` with stdout+stderr appended to `log_path` (env: envdefaults.child_env() when None)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, cwd=cwd, env=env if env is not None else envdefaults.child_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_die_with_parent)


def stop(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM the child's whole session (it flushes and exits), SIGKILL after `grace_s`."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
