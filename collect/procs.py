"""Child processes of a round (the endpoint, the proxy): started in their own session so that
stopping one also stops what it spawned, and tied to our life so a killed `make collect`
leaves nothing holding a port."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(argv: list[str], log_path: Path, env: dict | None = None, cwd: str | Path | None = None) -> subprocess.Popen:
    """Start `argv` with stdout+stderr appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
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
