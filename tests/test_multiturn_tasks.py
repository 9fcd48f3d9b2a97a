"""datasets/multiturn: well-formed, written by its own generator, graded by the shared grader; real
harbor trials in the bwrap sandbox grade the reference solution 1.0 and an untouched sandbox 0.0."""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.fixtures.trials import grade_tasks

REPO = Path(__file__).resolve().parents[1]
MT = REPO / "datasets" / "multiturn"
TASKS = sorted(p for p in MT.iterdir() if (p / "task.toml").is_file())


def test_task_set_shape():
    assert len(TASKS) == 8
    for task in TASKS:
        for rel in ("instruction.md", "tests/test.sh", "tests/spec.json", "tests/test_task.py", "solution/solve.sh"):
            assert (task / rel).is_file(), f"{task.name}: missing {rel}"
        assert tomllib.loads((task / "task.toml").read_text())["environment"]["workdir"] == "/app"
        spec = json.loads((task / "tests" / "spec.json").read_text())
        assert spec["FAIL_TO_PASS"] == ["test_task.py::test_result"], task.name
        assert '"${WHARF_TASK_TOOLS:-/tests}/grade_pytest.sh"' in (task / "tests" / "test.sh").read_text()
        # the answer is in the sandbox, never in the instruction: it must be observed
        answer = (task / "tests" / "test_task.py").read_text().split("== ")[1].split("\n")[0].strip("'\"")
        assert answer not in (task / "instruction.md").read_text(), task.name


def test_generator_writes_the_committed_tasks(tmp_path):
    """The task dirs are what make_tasks.py writes (a fixed seed): regenerated, nothing changes."""
    shutil.copytree(MT, tmp_path / "multiturn")
    subprocess.run([sys.executable, str(tmp_path / "multiturn" / "make_tasks.py")], check=True, capture_output=True)
    diff = subprocess.run(["diff", "-r", str(MT), str(tmp_path / "multiturn"), "-x", "__pycache__"],
                          capture_output=True, text=True)
    assert diff.returncode == 0, diff.stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_oracle_solves_every_task_and_nop_none(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")
    oracle = asyncio.run(grade_tasks("oracle", TASKS, tmp_path / "oracle", concurrency=4))
    assert {k: v["reward"] for k, v in oracle.items()} == {t.name: 1.0 for t in TASKS}
    nop = asyncio.run(grade_tasks("nop", TASKS, tmp_path / "nop", concurrency=4))
    for name, rewards in nop.items():
        assert (rewards["reward"], rewards["log_ok"], rewards["p2p_passed"]) == (0.0, 1, 1), name
