"""What grading from pytest's reports costs per trial: the verifier of datasets/toy/fix-sum-to
(fixed), run N times each way, interleaved, on the host (no sandbox: the grading alone):

  * log: the former grade_pytest.sh, `python -I -m pytest` teed into a SWE-bench log by
    testlog.sh, then grading.py grades the log;
  * report: today's grade_pytest.sh (pytest_grade.py: the report plugin, verified records,
    the descendants reaped, the log graded beside them).

`python -m bench.grading [--n 10]`: wall and CPU (user+sys of all child processes) seconds per
grading, p50 and mean; CPU is the figure that holds on a shared, loaded machine.
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
TOOLS = ROOT / "collect" / "tasks"
TASK = ROOT / "datasets" / "toy" / "fix-sum-to"
PYTEST = "-I -m pytest -rA -p no:cacheprovider --noconftest -c /dev/null"
LOG_WAY = (f'cd "$W" && cp "$T/test_task.py" . && . {TOOLS}/testlog.sh && '
           f'wharf_run_tests "$V/test_output.log" "$P {PYTEST} --rootdir $W test_task.py" >/dev/null; '
           f'"$P" {TOOLS}/grading.py --spec "$T/spec.json" --log "$V/test_output.log" --out "$V" >/dev/null')
REPORT_WAY = f'bash {TOOLS}/grade_pytest.sh "$W" test_task.py >/dev/null'


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one(way: str, tmp: Path) -> tuple[float, float]:
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(TASK / "environment", tmp / "app")
    (tmp / "v").mkdir()
    fixed = (tmp / "app" / "mathutil.py").read_text().replace("range(1, n)", "range(1, n + 1)")
    (tmp / "app" / "mathutil.py").write_text(fixed)
    env = {**os.environ, "W": str(tmp / "app"), "T": str(TASK / "tests"), "V": str(tmp / "v"), "P": sys.executable,
           "WHARF_PYTHON": sys.executable, "WHARF_TESTS_DIR": str(TASK / "tests"), "WHARF_VERIFIER_DIR": str(tmp / "v")}
    t0, c0 = time.perf_counter(), _cpu()
    subprocess.run(["bash", "-c", way], env=env, check=True, timeout=300)
    took, cpu = time.perf_counter() - t0, _cpu() - c0
    reward = (tmp / "v" / "reward.json").read_text()
    assert '"reward": 1.0' in reward, f"the fixed task did not grade 1.0: {reward}"
    return took, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10)
    args = ap.parse_args()
    times: dict[str, list[tuple[float, float]]] = {"log": [], "report": []}
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.n):
            for name, way in (("log", LOG_WAY), ("report", REPORT_WAY)):
                times[name].append(one(way, Path(d) / f"{name}{i}"))
    p50 = {}
    for name, ts in times.items():
        for k, what in enumerate(("wall", "cpu")):
            xs = [t[k] for t in ts]
            p50[name, what] = statistics.median(xs)
            print(f"{name:7s}{what:5s} n={len(xs)} p50 {p50[name, what]:.3f} s  mean {statistics.mean(xs):.3f} s  "
                  f"min {min(xs):.3f} s")
    for what in ("wall", "cpu"):
        print(f"report/log p50 {what}: {p50['report', what] / p50['log', what]:.3f}")


if __name__ == "__main__":
    main()
