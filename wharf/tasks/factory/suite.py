"""Running a package's tests in its environment, offline, the way the judge will run them.

The same pytest options as the task's judge (tests/test.sh): the package's ini file without its
addopts, the pyroot on pytest's pythonpath, rootdir the package root, `python -I`. The run is in a
network namespace of its own (unshare), so a test that needs the network fails here, as in a trial.
"""
from __future__ import annotations

import collections
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import judged
from .package import FactoryError, Package

RUNNER = Path(__file__).with_name("suite_run.py")
NETWORK = re.compile(r"(gaierror|Network is unreachable|ConnectionError|ConnectTimeout|Temporary failure in name "
                     r"resolution|URLError|NewConnectionError|socket\.timeout|urlopen)")


@dataclass
class Outcome:
    tests: dict  # nodeid -> {"outcome", "message", "funcs"}
    collect_errors: dict  # nodeid of a collector that failed -> its message
    seconds: float
    timed_out: bool
    said: str = ""  # pytest's last line of output (why a run that collected nothing stopped)


def pytest_options(pkg: Package, root: str) -> list[str]:
    """The judge's options (taskdir.test_sh), and: a test file that does not import (a missing
    optional dep, test data named like a test) is left out, not the end of the run."""
    return ["-p", "no:cacheprovider", "-o", "addopts=", "-o", f"pythonpath={pkg.pyroot}", "--rootdir", root,
            "-q", "--continue-on-collection-errors", *pkg.pytest_args]


def _offline() -> list[str]:
    return ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]


def run(pkg: Package, work: Path, targets: list[str], cover: bool, timeout: float) -> Outcome:
    """Run `targets` (test paths or node ids) in `work`, a copy of the package root."""
    with tempfile.TemporaryDirectory(prefix="wharf-suite-") as tmp:
        out = Path(tmp) / "out.json"
        argv = [*_offline(), str(pkg.python), "-I", "-B", str(RUNNER), str(out), str(work), "1" if cover else "0",
                "--", *pytest_options(pkg, str(work)), *targets]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": tmp, "LANG": "C.UTF-8", "TMPDIR": tmp}
        t0 = time.monotonic()
        with open(Path(tmp) / "output.txt", "w+b") as log:
            try:
                subprocess.run(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT, timeout=timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
            said = next((ln.strip() for ln in reversed(log.read().decode(errors="replace").splitlines()) if ln.strip()), "")
        took = time.monotonic() - t0
        data = json.loads(out.read_text()) if out.exists() and not timed_out else {}
    return Outcome(data.get("tests", {}), data.get("collect_errors", {}), took, timed_out, said)


class Server:
    """suite_run.py's fork server for one hunt: the same runs as run() (cover off), in the same
    network namespace and environment, without an interpreter start and a pytest import each."""

    def __init__(self, pkg: Package, work: Path):
        self.pkg, self.work = pkg, work
        self.tmp = tempfile.TemporaryDirectory(prefix="wharf-suite-")
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.tmp.name, "LANG": "C.UTF-8", "TMPDIR": self.tmp.name}
        self.proc = subprocess.Popen([*_offline(), str(pkg.python), "-I", "-B", str(RUNNER), "--serve"], cwd=work,
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.buf = b""

    def _line(self, deadline: float) -> str | None:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise OSError("the suite server ended")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode()

    def run(self, targets: list[str], timeout: float) -> Outcome:
        out = Path(self.tmp.name) / "out.json"
        out.unlink(missing_ok=True)
        argv = [str(out), str(self.work), "0", "--", *pytest_options(self.pkg, str(self.work)), *targets]
        t0 = time.monotonic()
        self.proc.stdin.write((json.dumps({"argv": argv, "cwd": str(self.work)}) + "\n").encode())
        self.proc.stdin.flush()
        pid = self._line(t0 + 60)
        if pid is None:
            raise OSError("the suite server did not answer")
        timed_out = self._line(t0 + timeout) is None
        if timed_out:
            os.kill(int(pid), signal.SIGKILL)
            self._line(time.monotonic() + 60)
        data = json.loads(out.read_text()) if out.exists() and not timed_out else {}
        return Outcome(data.get("tests", {}), data.get("collect_errors", {}), time.monotonic() - t0, timed_out)

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.tmp.cleanup()


def working_copy(pkg: Package, parent: Path) -> Path:
    work = parent / pkg.key
    shutil.copytree(pkg.root, work, symlinks=True)
    return work


@dataclass
class Baseline:
    passing: list[str]  # passed in both runs, in the order pytest ran them
    covers: dict  # (file, qualname, first line) -> [nodeid, ...] of passing tests that ran it
    seconds: float  # one run's time


def baseline(pkg: Package, work: Path, timeout: float) -> Baseline:
    """The tests that pass twice, and the package functions each ran; a FactoryError when there
    are none (with the reason: the network, nothing passes, nothing of the package is covered)."""
    first = run(pkg, work, pkg.test_paths, cover=True, timeout=timeout)
    if first.timed_out:
        raise FactoryError(f"{pkg.name}=={pkg.version}: the test suite ran past {timeout:.0f} s")
    second = run(pkg, work, pkg.test_paths, cover=False, timeout=timeout)
    # A test file is left out whole when a test of it is defined elsewhere (a mixin class from the
    # tests' __init__.py): the judge runs whole files and grades only the functions they define.
    foreign = {t.split("::")[0] for t, r in first.tests.items() if r.get("foreign")}
    passing = [t for t, r in first.tests.items() if r["outcome"] == "passed" and t.split("::")[0] not in foreign
               and second.tests.get(t, {}).get("outcome") == "passed"]
    plain = len(passing)
    if passing:
        passing = judged.passing_under_judge(pkg, work, passing, pytest_options(pkg, str(work)), timeout)
    if not passing:
        raise FactoryError(_none_passes(pkg, first, foreign, plain))
    covers: dict = {}
    tests_prefix = tuple(p.rstrip("/") for p in pkg.test_paths)
    for t in passing:
        for f, q, line in first.tests[t]["funcs"]:
            if _is_source(f, tests_prefix):
                covers.setdefault((f, q, line), []).append(t)
    if not covers:
        raise FactoryError(f"{pkg.name}=={pkg.version}: the passing tests cover no function of the package")
    return Baseline(passing, covers, first.seconds)


def _none_passes(pkg: Package, first: Outcome, foreign: set, plain: int) -> str:
    """Why no test of the suite can make a task, in one line."""
    key = f"{pkg.name}=={pkg.version}"
    failed = [r["message"] for r in first.tests.values() if r["outcome"] == "failed"]
    if any(NETWORK.search(m) for m in failed):
        return f"{key}: the test suite needs the network (no test passes offline)"
    if plain:
        return f"{key}: {plain} tests pass in a plain pytest run, but none under the pytest judge"
    why = f", {len(foreign)} files of tests defined in other files left out" if foreign else ""
    if first.collect_errors:
        where, msg = next(iter(first.collect_errors.items()))
        why += f"; {len(first.collect_errors)} not collected, e.g. {where or '.'}: {msg.strip().splitlines()[-1][:160]}"
    elif not first.tests and first.said:  # pytest stopped before collecting (a conftest it refused)
        why += f"; pytest stopped: {first.said[:160]}"
    elif failed:  # one cause behind most failures (wcwidth's conftest wants its C extension)
        msg, n = collections.Counter((m.strip().splitlines() or [""])[0][:160] for m in failed).most_common(1)[0]
        why += f"; {len(failed)} failed, {n} of them with: {msg}"
    return f"{key}: no test passes on the pristine source ({len(first.tests)} collected{why})"


def _is_source(path: str, tests_prefix: tuple[str, ...]) -> bool:
    name = os.path.basename(path)
    parts = path.split("/")
    return (path.endswith(".py") and not path.startswith(tests_prefix) and name != "conftest.py"
            and not name.startswith("test_") and not name.endswith("_test.py")
            and not {"tests", "test", "testing"} & set(parts[:-1]))


def sample(items: list[str], n: int, rng: random.Random) -> list[str]:
    return list(items) if len(items) <= n else sorted(rng.sample(items, n), key=items.index)
