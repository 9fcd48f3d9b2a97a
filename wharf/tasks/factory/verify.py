"""Is a made task sound? The oracle gets 1.0 and the untouched workspace 0, through the real
judge (the task's own tests/test.sh, which runs pytest_grade.py), on this host.

Where `wharf tasks check` is not handed in, this is the factory's check; `check_task` below is
the one place where the checker plugs in.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from wharf.tasks.check.taskformat import TaskFormatError
from wharf.tasks.tools.judge_io import ERROR_FILE  # what the judge writes instead of a reward

TOOLS = Path(__file__).resolve().parents[1] / "tools"  # wharf/tasks/tools: the judges
CHECK_RUNS = 3  # the oracle and the untouched workspace, each


def judge(task: Path, oracle: bool, timeout: float = 600) -> float | str | None:
    """The reward the judge gives the task's workspace (with solution/ applied when `oracle`);
    the judge's reason (a str) when it could not judge; None when solution/ failed to apply."""
    task = task.resolve()  # test.sh runs in the workspace: a relative --out would lose its tests/
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


def judge_digest() -> str:
    """12 hex of the judges' code (wharf/tasks/tools): a task checked under other code is to be
    checked again, as the manifests made before issue 53's judge was hardened had to be."""
    h = hashlib.sha256()
    for f in sorted(TOOLS.iterdir()):
        if f.suffix in (".py", ".sh", ".c") and f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def env_digest(manifest: dict) -> str:
    """12 hex of a manifest's env lock (`env`): a check made in an env of other versions is to be
    made again, as one made under other judges' code is (a hand-edited lock voids its records)."""
    return hashlib.sha256("\n".join(manifest.get("env") or []).encode()).hexdigest()[:12]


def passed_under(bug: dict, digest: str, env: str) -> bool:
    """Does this manifest bug hold a pass of `wharf tasks check` made under the judges' code
    `digest`, in the env whose lock hashes to `env` (env_digest)?"""
    record = bug.get("checked") or {}
    return record.get("judge") == digest and record.get("env") == env


def checked_bugs(manifest: dict, digest: str) -> list[dict]:
    """The manifest's bugs that hold a pass under `digest` in the env its lock names."""
    env = env_digest(manifest)
    return [b for b in manifest["bugs"] if passed_under(b, digest, env)]


def check_task(task: Path, checker=None, redteam: bool = False) -> tuple[bool, str, dict | None]:
    """(passed, why, the record a manifest keeps of a pass of `wharf tasks check` or None).
    CHECKER PLUG-IN POINT: `wharf tasks make` run through `wharf tasks` is handed `wharf tasks
    check`'s check_task (wharf.pipeline.taskcheck: it stands above this room, so it comes as an
    argument); its verdict (oracle 1.0 and untouched 0 over 3 runs, the tier-1 hackability
    audit, and with `redteam` the red team's scripted attackers) decides. Without it (python -m
    wharf.tasks.factory), own_check's does."""
    if checker is None:
        return (*own_check(task), None)
    try:
        verdict = checker(task, runs=CHECK_RUNS, redteam=redteam)
    except TaskFormatError as e:  # this task dir is malformed (a Docker task, say): the others go on
        return False, f"not a well-formed task dir: {e}", None
    if not verdict.ok:
        return False, "; ".join(verdict.reasons[:2]), None
    record = {"judge": judge_digest(), "runs": CHECK_RUNS, "tier1": True, "tier2": redteam,
              "seconds": round(sum(verdict.seconds.values()), 1), "date": time.strftime("%Y-%m-%d", time.gmtime())}
    return True, "checked", record
