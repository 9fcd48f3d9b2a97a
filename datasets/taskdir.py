"""Write one harbor task dir graded by the checker judge: what the task generators of
datasets/learn and datasets/multiturn share (imported by their make_tasks.py, never by wharf)."""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

TEST_SH = """#!/bin/bash
# The checker judge (wharf/tasks/tools/judge.sh, exported by the bwrap sandbox as $WHARF_TASK_TOOLS):
# tests/check.py reads the state the agent left, from outside it; no code of the workspace runs.
exec bash "${WHARF_TASK_TOOLS:-/tests}/judge.sh" checker /app
"""
DOC = ('"""The checker of this task (wharf/tasks/tools/judge.py): each check gets a read-only view of the\n'
       'workspace the agent left and fails by raising; nothing of the workspace is imported here')
DOC_RUNS = (' (a value\nor a call of the code comes back as plain data from a separate process)."""\n')


def task_toml(category: str, tags: list[str], family: str | None = None) -> str:
    """`family`: the kind a held-out instance is a copy of (its near-copies share it; wharf eval
    clusters its intervals by it)."""
    fam = f'family = "{family}"\n' if family else ""
    return (f'[metadata]\njudge = "checker"\ndifficulty = "easy"\ncategory = "{category}"\n{fam}'
            f"tags = {json.dumps(tags, separators=(', ', ': '))}\n\n"
            '[agent]\ntimeout_sec = 600.0\n\n[verifier]\ntimeout_sec = 300.0\n\n[environment]\nworkdir = "/app"\n')


def check_file(result: str, kept: str) -> str:
    """check.py with test_result / test_kept of these bodies (indented lines); the docstring says
    how a check that runs workspace code (state.call / state.value) gets its answer."""
    runs = "state.call(" in result + kept or "state.value(" in result + kept
    doc = DOC + (DOC_RUNS if runs else '."""\n')
    return f"{doc}\n\ndef test_result(state):\n{result}\n\ndef test_kept(state):\n{kept}"


@dataclass(frozen=True)
class TaskDir:
    name: str
    files: dict[str, str]  # environment/ (the workspace /app), path -> text
    instruction: str
    command: str  # the oracle's, the last line of solution/solve.sh
    check: str  # tests/check.py, defining test_result (FAIL_TO_PASS) and test_kept (PASS_TO_PASS)


def write(t: TaskDir, root: Path, prefix: str, toml: str) -> None:
    """Write (or rewrite from scratch) root/<t.name>; `prefix` names the set in spec.json."""
    d = root / t.name
    shutil.rmtree(d, ignore_errors=True)
    for rel, text in t.files.items():
        (d / "environment" / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / "environment" / rel).write_text(text)
    (d / "instruction.md").write_text(t.instruction)
    (d / "task.toml").write_text(toml)
    (d / "solution").mkdir()
    (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\nset -e\ncd /app\n{t.command}\n")
    (d / "tests").mkdir()
    (d / "tests" / "test.sh").write_text(TEST_SH)
    (d / "tests" / "check.py").write_text(t.check)
    spec = {"instance_id": f"{prefix}__{t.name}", "repo": f"wharf/{prefix}-{t.name}", "version": "1",
            "FAIL_TO_PASS": ["check.py::test_result"], "PASS_TO_PASS": ["check.py::test_kept"],
            "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"}
    (d / "tests" / "spec.json").write_text(json.dumps(spec, indent=2) + "\n")
    for sh in (d / "solution" / "solve.sh", d / "tests" / "test.sh"):
        sh.chmod(0o755)
