"""A made task's oracle graded by the pytest judge two ways, side by side: the spec's node ids
(--only-spec, what `wharf tasks make`'s test.sh asks for) and the whole test files (the same
test.sh without it). Wall seconds per grading, the ratio, and each way's rewards.

    python bench/judge_only_spec.py TASK_DIR... [--runs N]     (task dirs made by wharf tasks make)
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from wharf.tasks.factory import verify


def _graded(task: Path, runs: int) -> tuple[float, list]:
    """(wall seconds per grading, the rewards) of the task's oracle, `runs` times."""
    t0, rewards = time.monotonic(), [verify.judge(task, oracle=True) for _ in range(runs)]
    return (time.monotonic() - t0) / runs, rewards


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("tasks", nargs="+", type=Path)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    print(f"{'task':<34} {'only-spec s':>11} {'whole files s':>13} {'ratio':>6}  rewards (only-spec / whole)")
    same = True
    for task in args.tasks:
        if "--only-spec" not in (task / "tests" / "test.sh").read_text():
            print(f"{task}: its test.sh has no --only-spec (made before it?)", file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory() as tmp:
            whole = Path(tmp) / task.name
            shutil.copytree(task, whole, symlinks=True)
            sh = whole / "tests" / "test.sh"
            sh.write_text(sh.read_text().replace("--only-spec ", ""))
            spec_s, spec_r = _graded(task, args.runs)
            whole_s, whole_r = _graded(whole, args.runs)
        same &= spec_r == whole_r
        print(f"{task.name:<34} {spec_s:>11.2f} {whole_s:>13.2f} {whole_s / spec_s:>6.2f}  {spec_r} / {whole_r}",
              flush=True)
    print(f"same rewards both ways: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
