"""Shared fixtures. `engine_url`: one real local engine (SmolLM2-135M on the CPU) per test session."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import pytest

from wharf.core import envdefaults, procs
from wharf.core.endpoint import Endpoint
from tests.suite_budget import pytest_collection_modifyitems, pytest_terminal_summary  # noqa: F401 (hooks)

REPO = Path(__file__).resolve().parents[1]
CI_SKIPS_PAGE = "docs/development.md"  # its `CI skips: N` line: how many tests a CI run may skip

# Task dirs under fixtures/ hold the tests a grader runs inside a trial (they import the task's
# code), not tests of wharf.
collect_ignore_glob = ["fixtures/*"]

envdefaults.apply()


# With CI set, a part a test needs that is missing fails the run instead of skipping it: a CI
# that cannot run the sandbox must not go quietly green.
IN_CI = bool(os.environ.get("CI"))
needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None and not IN_CI, reason="bubblewrap (bwrap) is not installed"
)


def pytest_sessionstart(session):
    if IN_CI and shutil.which("bwrap") is None:
        raise pytest.UsageError("CI is set but bwrap is missing: install bubblewrap (make setup does it)")


def stated_ci_skips(text: str) -> int:
    """The number of tests docs/development.md says a CI run skips (its `CI skips: N` line)."""
    m = re.search(r"CI skips: (\d+)", text)
    if m is None:
        raise ValueError(f"{CI_SKIPS_PAGE}: no `CI skips: N` line (how many tests a CI run may skip)")
    return int(m.group(1))


def pytest_sessionfinish(session, exitstatus):
    """In CI, a run that skipped more (or fewer) tests than docs/development.md says fails."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    worker = hasattr(session.config, "workerinput")  # xdist: the controller counts every worker's skips
    if not IN_CI or worker or reporter is None or session.config.option.collectonly:
        return
    skipped = len(reporter.stats.get("skipped", []))
    expected = stated_ci_skips((REPO / CI_SKIPS_PAGE).read_text())
    if skipped != expected:
        reporter.write_line(f"CI: {skipped} tests skipped, {CI_SKIPS_PAGE} says {expected} (CI skips: N): "
                            "a part a test needs is missing, or that page is out of date", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def kill_when(cmd: list[str], ready: Callable[[], bool], log: Path, what: str, timeout: float,
              env: dict | None = None, interval: float = 0.2, tree: bool = False) -> None:
    """Run `cmd` (in its own session, output to `log`) until `ready()` (which may assert on the way),
    then SIGKILL its whole process group: a machine lost mid-run, for the resume tests. Fails if it
    exits first or `what` does not happen within `timeout` seconds. `tree`: its descendants in
    sessions of their own (a loop's collect child, its proxy, their sandboxes) too, stopped first so
    that none of them goes on after its parent (PDEATHSIG) as nothing does on a machine lost."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while not ready():
            assert proc.poll() is None, f"the loop exited ({proc.returncode}) before {what}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
            time.sleep(interval)
    finally:
        rest = _stopped_tree(proc.pid) if tree else []
        os.killpg(proc.pid, signal.SIGKILL)
        _signal(rest, signal.SIGKILL)
        proc.wait()


def _stopped_tree(pid: int) -> list[int]:
    """`pid`'s descendants, each SIGSTOPped (again until no new one appears)."""
    stopped: set[int] = set()
    while new := set(_descendants(pid)) - stopped:
        _signal(new, signal.SIGSTOP)
        stopped |= new
    return sorted(stopped)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:  # "pid (comm) state ppid ...": comm may hold spaces and parentheses
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        out.append(todo.pop())
        todo += children.get(out[-1], [])
    return out


def _signal(pids, sig: int) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def stub():
    """A vLLM-format stub upstream (testing/vllm_stub.py), one per test module."""
    from testing.vllm_stub import StubServer

    with StubServer() as s:
        yield s


@pytest.fixture(scope="session")
def engine_url():
    """Base URL ("http://127.0.0.1:PORT") of a `python -m wharf.engine` started for this session."""
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="wharf-engine-")) / "engine.log"
    cmd = [sys.executable, "-m", "wharf.engine", "--config", str(REPO / "configs/default.yaml"),
           f"engine.port={port}", "engine.host=127.0.0.1", "engine.threads=2"]
    proc = procs.spawn(cmd, log, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        Endpoint(url).wait_healthy(300, proc, log)
        yield url
    finally:
        procs.stop(proc)


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 server (SeaweedFS, testing/s3_server.py) on 127.0.0.1 for the session, with one
    bucket; yields (bucket, the AWS_* variables an S3 user sets)."""
    from testing.s3_server import SeaweedS3

    with SeaweedS3(tempfile.mkdtemp(prefix="wharf-s3-")) as server:
        server.create_bucket("wharf-test")
        yield "wharf-test", server.env


@pytest.fixture
def s3(s3_server, monkeypatch, tmp_path):
    """This test's own prefix in the session's bucket (s3://wharf-test/<test>-<uuid>), the AWS_*
    variables set, and the local mirrors in this test's tmp dir."""
    import uuid

    bucket, env = s3_server
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "mirror"))
    return f"s3://{bucket}/t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def s3_faults(s3, s3_server, monkeypatch):
    """The `s3` prefix reached through testing/s3_faults.py, a proxy that answers 503 on demand
    (set `.fail` to a (method, path) predicate); yields (prefix URL, the proxy)."""
    from testing.s3_faults import FaultyS3

    with FaultyS3(s3_server[1]["AWS_ENDPOINT_URL"]) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        yield s3, proxy
