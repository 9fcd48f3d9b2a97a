"""Is a made task sound? The oracle gets 1.0 and the untouched workspace 0, through the real
judge (the task's own tests/test.sh, which runs pytest_grade.py), on this host.

Where `wharf tasks check` is not handed in, this is the factory's check; `check_task` below is
the one place where the checker plugs in.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from wharf.tasks.tools.judge_io import ERROR_FILE  # what the judge writes instead of a reward

TOOLS = Path(__file__).resolve().parents[1] / "tools"  # wharf/tasks/tools: the judges


def judge(task: Path, oracle: bool, timeout: float = 600) -> float | str | None:
    """The reward the judge gives the task's workspace (with solution/ applied when `oracle`);
    the judge's reason (a str) when it could not judge; None when solution/ failed to apply."""
    with tempfile.TemporaryDirectory(prefix="wharf-verify-") as tmp:
        ws, out = Path(tmp) / "app", Path(tmp) / "verifier"
        shutil.copytree(task / "environment", ws, symlinks=True)
        out.mkdir()
        env = {**os.environ, "WHARF_TASK_TOOLS": str(TOOLS), "WHARF_TESTS_DIR": str(task / "tests"),
               "WHARF_VERIFIER_DIR": str(out), "WHARF_TESTBED": str(ws), "WHARF_PYTHON": sys.executable}
        if oracle:
            r = subprocess.run(["bash", str(task / "solution" / "solve.sh")], env=env, capture_output=True, timeout=120)
            if r.returncode != 0:
                return None
        subprocess.run(["bash", str(task / "tests" / "test.sh")], env=env, capture_output=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
        return _reward(out)


def _reward(out: Path) -> float | str:
    """The reward of a verifier dir, or the judge's one-line reason when it could not judge."""
    try:
        return float(json.loads((out / "reward.json").read_text())["reward"])
    except (OSError, ValueError, KeyError):
        try:
            return "a verifier error: " + (out / ERROR_FILE).read_text().strip()
        except OSError:
            return "no reward and no verifier_error.txt from the judge"


def own_check(task: Path) -> tuple[bool, str]:
    oracle = judge(task, oracle=True)
    if oracle != 1.0:
        return False, f"the oracle gets {oracle} (1.0 wanted)"
    buggy = judge(task, oracle=False)
    if buggy != 0.0:
        return False, f"the untouched workspace gets {buggy} (0 wanted)"
    return True, "oracle 1.0, workspace 0"


def check_task(task: Path, checker=None) -> tuple[bool, str]:
    """(passed, why). CHECKER PLUG-IN POINT: `wharf tasks make` run through `wharf tasks` is handed
    `wharf tasks check`'s check_task (wharf.pipeline.taskcheck: it stands above this room, so it
    comes as an argument); its verdict (oracle twice, untouched 0, stable over 3 runs, the tier-1
    hackability audit) decides. Without it (python -m wharf.tasks.factory), own_check's does."""
    if checker is None:
        return own_check(task)
    verdict = checker(task, runs=3, redteam=False)
    return bool(verdict.ok), "; ".join(verdict.reasons[:2]) or "checked"
