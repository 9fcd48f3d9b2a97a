"""datasets/learn: well-formed, graded by the shared grader, and real harbor trials in the bwrap
sandbox grade the reference solution 1.0 and an untouched repo 0.0 on every task."""
from __future__ import annotations

import asyncio
import json
import shutil
import tomllib
from pathlib import Path

import pytest

from tests.fixtures.trials import grade_tasks

REPO = Path(__file__).resolve().parents[1]
LEARN = REPO / "datasets" / "learn"
TASKS = sorted(p for p in LEARN.iterdir() if (p / "task.toml").is_file())


def test_task_set_shape():
    assert len(TASKS) == 8
    for task in TASKS:
        for rel in ("instruction.md", "tests/test.sh", "tests/spec.json", "tests/test_task.py", "solution/solve.sh"):
            assert (task / rel).is_file(), f"{task.name}: missing {rel}"
        assert tomllib.loads((task / "task.toml").read_text())["environment"]["workdir"] == "/app"
        spec = json.loads((task / "tests" / "spec.json").read_text())
        tests = (task / "tests" / "test_task.py").read_text()
        for test_id in spec["FAIL_TO_PASS"] + spec["PASS_TO_PASS"]:
            assert f"def {test_id.split('::')[1]}(" in tests, f"{task.name}: {test_id} is not in test_task.py"
        assert '"${WHARF_TASK_TOOLS:-/tests}/grade_pytest.sh"' in (task / "tests" / "test.sh").read_text()
        # the instruction spells the reference command: copying it is the skill to learn
        command = (task / "solution" / "solve.sh").read_text().strip().splitlines()[-1]
        assert command in (task / "instruction.md").read_text(), task.name


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_oracle_solves_every_task_and_nop_none(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")
    oracle = asyncio.run(grade_tasks("oracle", TASKS, tmp_path / "oracle", concurrency=4))
    assert {k: v["reward"] for k, v in oracle.items()} == {t.name: 1.0 for t in TASKS}
    nop = asyncio.run(grade_tasks("nop", TASKS, tmp_path / "nop", concurrency=4))
    for name, rewards in nop.items():
        assert (rewards["reward"], rewards["log_ok"], rewards["p2p_passed"]) == (0.0, 1, 1), name
