"""What a grading costs under each judge kind, and what each defence of the pytest judge adds:
one fixed task graded N times each way, interleaved, on the host (no sandbox: the grading alone).

  * log             `python -I -m pytest` teed into a SWE-bench log (testlog.sh), graded by grading.py
  * pytest-plain    the report plugin as it was before the audit hook (commit PLAIN_REV, taken
                    from git; skipped outside a git checkout), no second run
  * pytest-guard    today's plugin, its records sealed by the audit hook in C (wharf_seal.c), no second run
  * pytest-guard-pyseal  the same sealed in Python (pytest_guard's fallback: the tools without
                    the built wharf_seal), what the sealer in C costs or saves
  * pytest          today's grade_pytest.sh: audit hook, each run in a fresh copy of the workspace
                    with the pristine tests read-only, the second, out-of-process run of every test
  * pytest-before   grade_pytest.sh as of BEFORE_REV (before issue 53: the tests run in the
                    workspace itself, the second run of the FAIL_TO_PASS tests only), its sealer
                    built from that commit (skipped outside a git checkout or without gcc)
  * pytest-guard-bare  the same with the test process unconfined (jail.py's fallback): what
                    running it in namespaces of its own costs
  * contest         judge.sh contest on datasets/toy/fix-sum-to (62 drawn cases, 2 child processes)
  * contest-bare    judge.py contest with its children unconfined (jail.py's fallback)
  * checker-calls   judge.sh checker on tests/fixtures/tasks/checker-sum-to (3 calls, 3 children)
  * checker-files   judge.sh checker on datasets/learn/echo-color (reads two files, no child)

`python -m bench.grading [--n 5] [--ways pytest-guard,pytest-guard-pyseal]`: wall and CPU (user+sys of every process of the grading: a
cpuacct cgroup where one can be made, else the waited children's rusage) seconds per grading,
p50 and mean; CPU is the figure that holds on a shared, loaded machine.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "wharf" / "tasks" / "tools"
PYTEST_TASK = ROOT / "tests" / "fixtures" / "tasks" / "pytest-sum-to"
PLAIN_REV = "ba8ac4d"  # the last commit whose report plugin held its own key
BEFORE_REV = "dbb609c"  # the pytest judge before issue 53 (strict outcomes, fresh copies, tamper checks)
PYTEST = "-I -m pytest -rA -p no:cacheprovider --noconftest -c /dev/null"
OPTS = '--spec "$T/spec.json" --out "$V" -- -rA -p no:cacheprovider --noconftest -c /dev/null --rootdir "$W" test_task.py'
FIX = "sed -i 's/range(1, n)/range(1, n + 1)/' \"$W/mathutil.py\""
# A grader run with jail.py told that no namespaces can be had: the fallback, for comparison only.
BARE = ("'import runpy, sys; sys.path.insert(0, \"{tools}\"); import jail; jail._PROBE[\"why\"] = \"bench\"; "
        "f = \"{tools}/{script}\"; sys.argv[0] = f; runpy.run_path(f, run_name=\"__main__\")'")
WAYS = {  # name: (task dir, shell command; $W workdir, $T tests, $V verifier dir, $P python, $X plain tools,
    # $Y the tools without the sealer in C)
    "log": (PYTEST_TASK, f'{FIX} && cd "$W" && cp "$T/test_task.py" . && . {TOOLS}/testlog.sh && '
            f'wharf_run_tests "$V/test_output.log" "$P {PYTEST} --rootdir $W test_task.py" >/dev/null; '
            f'"$P" {TOOLS}/grading.py --spec "$T/spec.json" --log "$V/test_output.log" --out "$V" >/dev/null'),
    "pytest-plain": (PYTEST_TASK, f'{FIX} && cd "$W" && cp "$T/test_task.py" . && "$P" -I "$X/pytest_grade.py" {OPTS} >/dev/null'),
    "pytest-guard": (PYTEST_TASK, f'{FIX} && cd "$W" && cp "$T/test_task.py" . && "$P" -I {TOOLS}/pytest_grade.py {OPTS} >/dev/null'),
    "pytest-guard-pyseal": (PYTEST_TASK, f'{FIX} && cd "$W" && cp "$T/test_task.py" . && "$P" -I "$Y/pytest_grade.py" {OPTS} >/dev/null'),
    "pytest-guard-bare": (PYTEST_TASK, f'{FIX} && cd "$W" && cp "$T/test_task.py" . && "$P" -I -c '
                          + BARE.format(tools=TOOLS, script="pytest_grade.py") + f' {OPTS} >/dev/null'),
    "pytest": (PYTEST_TASK, f'{FIX} && bash {TOOLS}/grade_pytest.sh "$W" test_task.py >/dev/null'),
    "pytest-before": (PYTEST_TASK, f'{FIX} && bash "$B/grade_pytest.sh" "$W" test_task.py >/dev/null'),
    "contest": (ROOT / "datasets" / "toy" / "fix-sum-to", f'{FIX} && bash {TOOLS}/judge.sh contest "$W" >/dev/null'),
    "contest-bare": (ROOT / "datasets" / "toy" / "fix-sum-to", f'{FIX} && cd / && "$P" -I -S -c '
                     + BARE.format(tools=TOOLS, script="judge.py") + ' contest --tests "$T" --workdir "$W" --out "$V" >/dev/null'),
    "checker-calls": (ROOT / "tests" / "fixtures" / "tasks" / "checker-sum-to",
                      f'{FIX} && bash {TOOLS}/judge.sh checker "$W" >/dev/null'),
    "checker-files": (ROOT / "datasets" / "learn" / "echo-color",
                      f'echo blue > "$W/color.txt" && bash {TOOLS}/judge.sh checker "$W" >/dev/null'),
}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


CPUACCT = Path("/sys/fs/cgroup/cpuacct")  # cgroup v1's CPU accounting, where it can be written


class Account:
    """CPU seconds of every process a command starts. A cgroup counts the processes of a
    confined grading too (SIGKILLed in their namespace, they are never waited for, so the
    children's rusage misses them); without one, the rusage of waited children."""

    def __init__(self, name: str):
        self.path = CPUACCT / f"wharf-bench-{os.getpid()}-{name}"
        try:
            self.path.mkdir()
        except OSError:
            self.path = None
        self.c0 = _cpu()

    def prefix(self) -> str:
        return f"echo $$ > {self.path / 'cgroup.procs'} && " if self.path else ""

    def seconds(self) -> float:
        if self.path is None:
            return _cpu() - self.c0
        used = int((self.path / "cpuacct.usage").read_text()) / 1e9
        self.path.rmdir()
        return used


def plain_tools(dest: Path) -> Path | None:
    """collect/tasks as of PLAIN_REV (before the move under wharf/), or None when git or that commit is not at hand."""
    try:
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", PLAIN_REV, "collect/tasks"], capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    return dest / "collect" / "tasks"


def before_tools(dest: Path) -> Path | None:
    """wharf/tasks/tools as of BEFORE_REV, its sealer built, or None when git, that commit or gcc is not at hand."""
    try:
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE_REV, "wharf/tasks/tools"], capture_output=True,
                             check=True).stdout
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
        tools = dest / "wharf" / "tasks" / "tools"
        subprocess.run(["bash", str(tools / "build_seal.sh"), sys.executable], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return tools


def python_sealer_tools(dest: Path) -> Path:
    """wharf/tasks/tools without the built wharf_seal: pytest_guard falls back to its sealer in Python."""
    shutil.copytree(TOOLS, dest, ignore=shutil.ignore_patterns("wharf_seal*.so", "__pycache__", "swegym"))
    return dest


def one(name: str, tmp: Path, plain: Path | None, pyseal: Path, before: Path | None = None) -> tuple[float, float]:
    task, way = WAYS[name]
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(task / "environment", tmp / "app")
    (tmp / "v").mkdir()
    env = {**os.environ, "W": str(tmp / "app"), "T": str(task / "tests"), "V": str(tmp / "v"), "P": sys.executable,
           "X": str(plain or ""), "Y": str(pyseal), "B": str(before or ""), "WHARF_PYTHON": sys.executable, "WHARF_TESTS_DIR": str(task / "tests"),
           "WHARF_VERIFIER_DIR": str(tmp / "v")}
    account = Account(tmp.name)
    t0 = time.perf_counter()
    subprocess.run(["bash", "-c", account.prefix() + way], env=env, check=True, timeout=300)
    took, cpu = time.perf_counter() - t0, account.seconds()
    reward = (tmp / "v" / "reward.json").read_text()
    assert '"reward": 1.0' in reward, f"{name}: the fixed task did not grade 1.0: {reward}"
    return took, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--ways", default=",".join(WAYS), help="comma-separated ways to run (default: all)")
    args = ap.parse_args()
    wanted = args.ways.split(",")
    unknown = sorted(set(wanted) - set(WAYS))
    if unknown:
        ap.error(f"--ways: unknown {unknown}; known: {', '.join(WAYS)}")
    with tempfile.TemporaryDirectory() as d:
        plain, pyseal = plain_tools(Path(d)), python_sealer_tools(Path(d) / "pyseal-tools")
        before = before_tools(Path(d) / "before") if "pytest-before" in wanted else None
        names = [n for n in WAYS if n in wanted and (plain is not None or n != "pytest-plain")
                 and (before is not None or n != "pytest-before")]
        if plain is None:
            print(f"pytest-plain skipped: commit {PLAIN_REV} is not in a git checkout here")
        if before is None and "pytest-before" in wanted:
            print(f"pytest-before skipped: commit {BEFORE_REV} is not in a git checkout here, or gcc failed")
        times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
        for i in range(args.n):
            for name in names:
                times[name].append(one(name, Path(d) / f"{name}{i}", plain, pyseal, before))
    print(f"{'way':19s} {'wall p50':>9s} {'wall mean':>9s} {'cpu p50':>8s} {'cpu mean':>8s}   (seconds per grading, n={args.n})")
    for name, ts in times.items():
        walls, cpus = [t[0] for t in ts], [t[1] for t in ts]
        print(f"{name:19s} {statistics.median(walls):9.3f} {statistics.mean(walls):9.3f} "
              f"{statistics.median(cpus):8.3f} {statistics.mean(cpus):8.3f}")


if __name__ == "__main__":
    main()
