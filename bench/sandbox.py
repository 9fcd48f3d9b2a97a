"""What the sandbox's isolation costs per exec: `true` run N times

  * directly on the host (bash -c true),
  * in a one-shot bwrap sharing the host's namespaces (what each exec cost before: a new bwrap
    process per exec, read-only host binds, no user/pid/net namespace),
  * through BwrapEnvironment.exec: joining the trial's long-lived sandbox (own user, pid, mount,
    ipc, uts and network namespaces, unprivileged uid, no capability, pids cgroup),
and the start and stop of one sandbox. `python -m bench.sandbox [--n 50]`
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from wharf.collect.sandbox.bwrap import BwrapEnvironment

ONE_SHOT = ["bwrap", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64", "--ro-bind", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev",
            "--tmpfs", "/tmp", "--", "bash", "-c", "true"]


async def _times(argv: list[str], n: int) -> list[float]:
    """As BwrapEnvironment runs a command: an asyncio subprocess with its output piped."""
    out = []
    for _ in range(n):
        t = time.perf_counter()
        p = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                 stderr=asyncio.subprocess.PIPE, start_new_session=True)
        await p.communicate()
        assert p.returncode == 0
        out.append((time.perf_counter() - t) * 1000)
    return out


async def _sandbox(n: int) -> tuple[list[float], float, float]:
    tmp = Path(tempfile.mkdtemp(prefix="wharf-bench-"))
    (tmp / "env").mkdir()
    paths = TrialPaths(trial_dir=tmp / "trial")
    paths.mkdir()
    env = BwrapEnvironment(environment_dir=tmp / "env", environment_name="bench", session_id="bench",
                           trial_paths=paths, task_env_config=EnvironmentConfig(), git_init=False)
    t = time.perf_counter()
    await env.start(force_build=False)
    start_ms = (time.perf_counter() - t) * 1000
    out = []
    for _ in range(n):
        t = time.perf_counter()
        r = await env.exec("true")
        out.append((time.perf_counter() - t) * 1000)
        assert r.return_code == 0, r.stderr
    t = time.perf_counter()
    await env.stop(delete=True)
    return out, start_ms, (time.perf_counter() - t) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50)
    n = ap.parse_args().n
    host = asyncio.run(_times(["bash", "-c", "true"], n))
    once = asyncio.run(_times(ONE_SHOT, n))
    joined, start_ms, stop_ms = asyncio.run(_sandbox(n))
    base = statistics.median(host)
    print(f"exec of `true`, median of {n} (ms)        p50      p90   vs host")
    for name, xs in (("host bash -c true", host), ("one-shot bwrap (before)", once), ("sandbox exec (now)", joined)):
        xs = sorted(xs)
        p50, p90 = statistics.median(xs), xs[int(0.9 * (len(xs) - 1))]
        print(f"  {name:<32} {p50:7.1f} {p90:8.1f}   {p50 / base:5.1f}x   (+{p50 - base:.1f} ms)")
    print(f"sandbox start {start_ms:.0f} ms, stop {stop_ms:.0f} ms (once per trial)")


if __name__ == "__main__":
    main()
