"""datasets/multiturn: well-formed, written by its own generator, graded by the checker judge; real
harbor trials in the bwrap sandbox grade the reference solution 1.0 and an untouched sandbox 0.0."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.fixtures.trials import assert_oracle_1_nop_0, assert_judged_task_dir

REPO = Path(__file__).resolve().parents[1]
MT = REPO / "datasets" / "multiturn"
TASKS = sorted(p for p in MT.iterdir() if (p / "task.toml").is_file())


def test_task_set_shape():
    assert len(TASKS) == 8
    for task in TASKS:
        spec = assert_judged_task_dir(task, "checker")
        assert spec["FAIL_TO_PASS"] == ["check.py::test_result"], task.name
        # the answer is in the sandbox, never in the instruction: it must be observed
        answer = (task / "tests" / "check.py").read_text().split("== ")[1].split("\n")[0].strip("'\"")
        assert answer not in (task / "instruction.md").read_text(), task.name


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_oracle_solves_every_task_and_nop_none(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")
    assert_oracle_1_nop_0(TASKS, tmp_path)
