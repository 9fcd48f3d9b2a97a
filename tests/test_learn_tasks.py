"""datasets/learn: well-formed, graded by the checker judge, and real harbor trials in the bwrap
sandbox grade the reference solution 1.0 and an untouched repo 0.0 on every task."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.fixtures.trials import assert_oracle_1_nop_0, assert_judged_task_dir

REPO = Path(__file__).resolve().parents[1]
LEARN = REPO / "datasets" / "learn"
TASKS = sorted(p for p in LEARN.iterdir() if (p / "task.toml").is_file())


def test_task_set_shape():
    assert len(TASKS) == 8
    for task in TASKS:
        assert_judged_task_dir(task, "checker")
        # the instruction spells the reference command: copying it is the skill to learn
        command = (task / "solution" / "solve.sh").read_text().strip().splitlines()[-1]
        assert command in (task / "instruction.md").read_text(), task.name


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_oracle_solves_every_task_and_nop_none(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")
    assert_oracle_1_nop_0(TASKS, tmp_path)
