"""The baseline seen through the judge itself: the suite's passing tests run once more under
wharf's pytest judge (tools/pytest_grade.py: the report plugin, the sealer, the jail), and only
those it reports PASSED are kept. The judge instruments the run (audit hooks, exact comparisons,
pytest internals it checks), so a test can pass in a plain run and not under it; such a test
would make a task whose oracle never scores 1.0."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from .package import FactoryError, Package

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def passing_under_judge(pkg: Package, work: Path, passing: list[str], options: list[str], timeout: float) -> list[str]:
    """`passing` less the tests the judge does not report PASSED; `options`: the suite's pytest options.
    When the judge cannot grade the run as a whole (it voids a run for one file whose tests report
    from a thread, say), each file is judged on its own and the files it cannot grade are left out."""
    files = sorted({t.split("::")[0] for t in passing})
    statuses, problem = _judge(pkg, work, passing, files, options, timeout)
    if problem is None:
        return [t for t in passing if statuses.get(t) == "PASSED"]
    kept = []
    for f in files:
        mine = [t for t in passing if t.split("::")[0] == f]
        statuses, _ = _judge(pkg, work, mine, [f], options, timeout)
        kept += [t for t in mine if statuses.get(t) == "PASSED"]
    if not kept:
        raise FactoryError(f"{pkg.name}=={pkg.version}: the pytest judge cannot grade this suite ({problem[:200]})")
    return [t for t in passing if t in set(kept)]


def _judge(pkg: Package, work: Path, tests: list[str], files: list[str], options: list[str],
           timeout: float) -> tuple[dict, str | None]:
    """(the judge's status per test, its first problem or None) for a run of `files`; a voided run
    (a problem) has no statuses."""
    with tempfile.TemporaryDirectory(prefix="wharf-judged-") as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({"instance_id": f"{pkg.key}-baseline", "repo": pkg.name, "version": pkg.version,
                                    "FAIL_TO_PASS": [], "PASS_TO_PASS": tests,
                                    "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"}))
        out = Path(tmp) / "out"
        argv = [sys.executable, "-I", str(TOOLS / "pytest_grade.py"), "--spec", str(spec), "--out", str(out),
                "--timeout", str(int(timeout)), "--python", str(pkg.python), "--", *options, *files]
        subprocess.run(argv, cwd=work, capture_output=True, timeout=timeout + 120, stdin=subprocess.DEVNULL)
        try:
            grading = json.loads((out / "grading.json").read_text())
        except (OSError, ValueError):
            raise FactoryError(f"{pkg.name}=={pkg.version}: the pytest judge gave no verdict on the suite") from None
    if grading.get("problems"):
        return {}, str(grading["problems"][0])
    return grading.get("statuses", {}), None
