"""The processes a round needs: the endpoint (via collect.endpoint) and the recording proxy,
started as child processes, health-checked, and stopped at the end."""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp

from collect.config import RunConfig


class ServiceError(RuntimeError):
    """A service that would not start or answer."""


def _die_with_parent() -> None:
    # A child outliving a killed `make collect` would keep its port and block the resume.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(argv: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")
    return subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        preexec_fn=_die_with_parent,
    )


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout_s: float, what: str, log_path: Path | None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:] if log_path and log_path.exists() else ""
            raise ServiceError(f"{what} exited with code {proc.returncode} before it was healthy; log {log_path}:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise ServiceError(f"{what} did not answer {url} within {timeout_s:.0f}s (log: {log_path})")


def stop(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)  # the proxy folds its log into shards on SIGTERM
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def proxy_process(cfg: RunConfig, config_path: Path, turns_dir: Path, log_path: Path):
    """Run `python -m collect.proxy` writing its shards to `turns_dir` for the life of the block."""
    argv = [sys.executable, "-m", "collect.proxy", "--config", str(config_path), f"proxy.out_dir={turns_dir}"]
    proc = spawn(argv, log_path)
    try:
        wait_healthy(f"http://{cfg.proxy.host}:{cfg.proxy.port}/health", proc, 60, "the proxy", log_path)
        yield proc
    finally:
        stop(proc)


class ProxyAdmin:
    """Client of the proxy's admin API: open and close rollouts."""

    def __init__(self, url: str, token: str):
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "ProxyAdmin":
        self._session = aiohttp.ClientSession(headers=self._headers, timeout=aiohttp.ClientTimeout(total=120))
        return self

    async def __aexit__(self, *exc) -> None:
        await self._session.close()

    async def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        async with self._session.request(method, self.url + path, json=body) as r:
            if r.status >= 400:
                raise ServiceError(f"proxy {method} {path}: HTTP {r.status}: {await r.text()}")
            return await r.json()

    async def open(self, rollout_id: str, policy: str) -> dict:
        return await self._call("POST", "/admin/rollouts", {"rollout_id": rollout_id, "policy": policy})

    async def close(self, rollout_id: str) -> dict:
        return await self._call("POST", f"/admin/rollouts/{rollout_id}/close")

    async def flush(self) -> dict:
        return await self._call("POST", "/admin/flush")
