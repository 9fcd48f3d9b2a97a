"""The pytest judge's route attackers (issue 53) against the judge before and after, side by side.

`python -m bench.judge_routes [--attacks a,b] [--n 1]`: each attacker of
tests/fixtures/redteam/routes.py (wharf/tasks/redteam/routes.py's aimed at it, and one of its own;
and answers.py's `always_equal`) graded on the unsolved
pytest-sum-to by `grade_pytest.sh` on the host (confined where bubblewrap works, as in
tests/test_pytest_grade.py), once with the tools of bench.grading.BEFORE_REV (their sealer built
from that commit) and once with today's; prints the reward, the recheck and records_ok of each.
Host gradings, not sandbox trials: tests/test_redteam.py runs today's in real rounds.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.grading import BEFORE_REV, before_tools
from tests.fixtures.redteam.routes import ROUTE_ATTACKS
from tests.test_pytest_grade import TOOLS, _grade
from wharf.tasks.redteam import SUM_TO, answer_tails

BUGGY = SUM_TO.source
ANSWER_ATTACKS_TAIL = answer_tails(SUM_TO)

ATTACKS = [*sorted(ROUTE_ATTACKS), "always_equal"]


def grade(name: str, tools: Path) -> str:
    with tempfile.TemporaryDirectory() as d:
        if name == "always_equal":
            r = _grade(Path(d), BUGGY + ANSWER_ATTACKS_TAIL[name], timeout=30, tools=tools)
        else:
            r = _grade(Path(d), timeout=30, tools=tools, files=ROUTE_ATTACKS[name])
    return f"{r['reward']:.1f} (recheck {r['recheck']:2d}, records_ok {r['records_ok']})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attacks", default=",".join(ATTACKS), help="comma-separated attackers (default: all)")
    ap.add_argument("--n", type=int, default=1, help="gradings of each attacker each way (a race may need more)")
    args = ap.parse_args()
    wanted = args.attacks.split(",")
    unknown = sorted(set(wanted) - set(ATTACKS))
    if unknown:
        ap.error(f"--attacks: unknown {unknown}; known: {', '.join(ATTACKS)}")
    with tempfile.TemporaryDirectory() as d:
        before = before_tools(Path(d) / "before")
        if before is None:
            ap.error(f"commit {BEFORE_REV} is not in a git checkout here, or gcc failed")
        print(f"{'attacker':22s} {'before (' + BEFORE_REV + ')':36s} after")
        for name in wanted:
            for _ in range(args.n):
                print(f"{name:22s} {grade(name, before):36s} {grade(name, TOOLS)}", flush=True)


if __name__ == "__main__":
    main()
