"""Shared fixtures. `engine_url`: one real local engine (SmolLM2-135M on the CPU) per test session."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The engine, the proxy and the tests share few cores (shared/notes/perf.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the engine exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"the engine did not answer {url}/health within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def engine_url():
    """Base URL ("http://127.0.0.1:PORT") of a `python -m collect.engine` started for this session."""
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="wharf-engine-")) / "engine.log"
    cmd = [sys.executable, "-m", "collect.engine", "--config", str(REPO / "configs/default.yaml"),
           f"engine.port={port}", "engine.host=127.0.0.1", "engine.threads=2"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
