"""The recording proxy and its stub upstream as processes, and a multi-process load generator:
what tests/test_proxy_load.py and the proxy benchmark (bench/proxy.py) drive.

The stub is `python -m testing.vllm_stub`; the proxy gets its config as every child stage
does (wharf.procs.stage_argv). With `cpus`, a process is pinned there with taskset.
"""
from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp

from wharf.core import envdefaults
from wharf.core.config import load_config
from wharf.core.credentials import AdminAccess
from wharf.core.layout import admin_file, wal_dir
from wharf.core.procs import stage_argv

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chat_body(size: int = 8192, stream: bool = False, seed: int | None = None) -> bytes:
    """A chat-completions body of about `size` bytes (a long user turn), as an agent would send it."""
    words = ("import os\nfrom pathlib import Path\ndef main(argv):\n    return run(argv)\n" * (size // 64 + 1))[:size]
    body = {"model": "agent-model", "messages": [{"role": "system", "content": "You are a coding agent."},
                                                 {"role": "user", "content": words}], "max_tokens": 50}
    if stream:
        body["stream"] = True
    if seed is not None:
        body["seed"] = seed
    return json.dumps(body).encode()


# -- processes --------------------------------------------------------------------------------
def _cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return list(range(os.cpu_count() or 1))


def pinned(cmd: list[str], cpus: list[int] | None) -> list[str]:
    if cpus and shutil.which("taskset"):
        return ["taskset", "-c", ",".join(map(str, cpus)), *cmd]
    return cmd


def wait_url(url: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s")


def start_stub(port: int, cpus=None, error_rate: float = 0.0, completion_tokens: int = 50, log=None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "testing.vllm_stub", "--port", str(port), "--error-rate", str(error_rate),
           "--completion-tokens", str(completion_tokens)]
    proc = subprocess.Popen(pinned(cmd, cpus), cwd=REPO, stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT)
    wait_url(f"http://127.0.0.1:{port}/health", proc)
    return proc


def start_proxy(port: int, upstream: str, out_dir: str | Path, cpus=None, extra=(), log=None) -> subprocess.Popen:
    cfg = load_config(None, [f"endpoint.url={upstream}", f"proxy.port={port}", f"proxy.out_dir={out_dir}",
                             "proxy.health_interval_s=0", *extra])
    cmd = stage_argv("wharf.collect.proxy", cfg, Path(out_dir).parent / f"proxy-{port}.yaml")
    admin_file(wal_dir(Path(out_dir))).unlink(missing_ok=True)  # a killed proxy's, not this one's
    proc = subprocess.Popen(pinned(cmd, cpus), cwd=REPO, stdout=log or subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, env=envdefaults.child_env())
    wait_url(f"http://127.0.0.1:{port}/health", proc)
    return proc


def stop(proc: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 30.0) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def admin_access(out_dir: str | Path) -> AdminAccess:
    """The admin URL and token of the proxy start_proxy started on `out_dir` (from its admin.json)."""
    return AdminAccess.load(admin_file(wal_dir(Path(out_dir))))


def admin(access: AdminAccess, method: str, path: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(f"{access.url}{path}", method=method, data=json.dumps(body or {}).encode(),
                                 headers={"Authorization": f"Bearer {access.token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def recorded_calls(base: str) -> int:
    """The calls a proxy has recorded since it started, every status (its /metrics)."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("wharf_proxy_calls_total{"))


# -- load generator ---------------------------------------------------------------------------
def load_stopper():
    """An event run_load's processes watch: set it to end the load."""
    return mp.get_context("spawn").Event()


async def _drive(targets: list[tuple[int, str, dict, bytes]], n_calls: int, seconds: float | None,
                 stop=None) -> list[tuple]:
    """One task per target (a client with its own connection), pulling calls from a shared count
    until it runs out, `seconds` pass or the `stop` event is set."""
    results: list[tuple] = []
    budget = iter(range(n_calls))
    deadline = time.monotonic() + seconds if seconds else None
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        async def client(idx: int, url: str, headers: dict, body: bytes) -> None:
            stream = b'"stream": true' in body
            for _ in budget:
                if (deadline and time.monotonic() > deadline) or (stop is not None and stop.is_set()):
                    return
                t0 = time.perf_counter()
                try:
                    async with session.post(url, data=body, headers=headers) as r:
                        data = await r.read()
                        ok = r.status == 200 and (not stream or data.endswith(b"data: [DONE]\n\n"))
                        results.append((idx, r.status, ok, r.headers.get("x-wharf-request-id"),
                                        time.perf_counter() - t0))
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                    results.append((idx, -1, False, None, time.perf_counter() - t0, repr(e)))
                    await asyncio.sleep(0.01)  # the server is down: do not spin

        await asyncio.gather(*(client(i, u, h, b) for i, u, h, b in targets))
    return results


def _worker(targets, n_calls, seconds, cpus, queue, stop) -> None:
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:
            pass
    queue.put(asyncio.run(_drive(targets, n_calls, seconds, stop)))


def run_load(targets: list[tuple[str, dict, bytes]], n_calls: int, procs: int = 2, cpus=None,
             seconds: float | None = None, stop=None) -> tuple[list[tuple], float]:
    """Spread the targets (one connection each) over `procs` processes; returns (results, wall seconds).
    `stop`: an event of the spawn context (load_stopper()) that ends the load when set.

    A result is (target index, HTTP status or -1, complete, x-wharf-request-id, latency[, error]).
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    groups = [[(i, *t) for i, t in enumerate(targets) if i % procs == p] for p in range(procs)]
    shares = [n_calls * len(g) // len(targets) for g in groups]
    shares[0] += n_calls - sum(shares)
    workers = [ctx.Process(target=_worker, args=(g, s, seconds, cpus, queue, stop))
               for g, s in zip(groups, shares) if g]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    results = []
    for _ in workers:
        while True:
            try:
                results += queue.get(timeout=1)
                break
            except Exception:  # queue.Empty: make sure a dead worker does not hang us
                if not any(w.is_alive() for w in workers) and queue.empty():
                    raise RuntimeError("a load generator process died; see its traceback above") from None
    wall = time.perf_counter() - t0
    for w in workers:
        w.join()
    return results, wall
