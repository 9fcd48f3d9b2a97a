"""The bundled toy task set: well-formed, and real harbor trials in the bwrap sandbox grade the
reference solution 1.0 and an untouched repo 0.0 on every task."""
from __future__ import annotations

import asyncio
import os
import json
import shutil
import tomllib
from pathlib import Path

import pytest

from tests.fixtures.trials import grade_tasks

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "datasets" / "toy"
TASKS = sorted(p for p in TOY.iterdir() if (p / "task.toml").is_file())
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


def test_task_set_shape():
    assert 8 <= len(TASKS) <= 12
    difficulties = set()
    for task in TASKS:
        for rel in ("instruction.md", "tests/test.sh", "tests/spec.json", "tests/test_task.py", "solution/solve.sh"):
            assert (task / rel).is_file(), f"{task.name}: missing {rel}"
        meta = tomllib.loads((task / "task.toml").read_text())
        difficulties.add(meta["metadata"]["difficulty"])
        spec = json.loads((task / "tests" / "spec.json").read_text())
        tests = (task / "tests" / "test_task.py").read_text()
        for test_id in spec["FAIL_TO_PASS"] + spec["PASS_TO_PASS"]:
            assert f"def {test_id.split('::')[1]}(" in tests, f"{task.name}: {test_id} is not in test_task.py"
        assert not (task / "environment" / "Dockerfile").exists()  # the bwrap sandbox cannot build one
    assert difficulties == {"easy", "medium", "hard"}


def test_tasks_grade_with_the_shared_tools():
    """One grader for every task: test.sh runs collect/tasks/grade_pytest.sh (exported by the
    sandbox as WHARF_TASK_TOOLS), never a copy that could go stale."""
    for task in TASKS:
        script = (task / "tests" / "test.sh").read_text()
        assert '"${WHARF_TASK_TOOLS:-/tests}/grade_pytest.sh"' in script, task.name
        assert not (task / "tests" / "grading.py").exists(), task.name


@needs_bwrap
@pytest.mark.slow
def test_oracle_solves_every_task_and_nop_none(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")
    oracle = asyncio.run(grade_tasks("oracle", TASKS, tmp_path / "oracle"))
    assert {k: v["reward"] for k, v in oracle.items()} == {t.name: 1.0 for t in TASKS}
    nop = asyncio.run(grade_tasks("nop", TASKS, tmp_path / "nop"))
    # an untouched repo: the FAIL_TO_PASS test fails, PASS_TO_PASS passes, the log is gradable
    for name, rewards in nop.items():
        assert (rewards["reward"], rewards["log_ok"], rewards["p2p_passed"]) == (0.0, 1, 1), name
    # the sandboxes are gone
    assert not any((tmp_path / "oracle" / "state").iterdir())
    # the verifier's log and grading story land in the trial dir
    verifier = tmp_path / "oracle" / "trials" / "sed-add__oracle" / "verifier"
    assert ">>>>> Test Exit Code: 0" in (verifier / "test_output.log").read_text()
    assert json.loads((verifier / "grading.json").read_text())["resolved"] is True


@pytest.mark.slow
@pytest.mark.parametrize("plant", ["conftest.py", "pytest.ini", "pytest.py", "sitecustomize.py"])
def test_grade_pytest_ignores_planted_test_config_outside_the_sandbox(tmp_path, plant):
    """Where no sandbox sets the agent's test config aside (Docker), the grader itself ignores
    conftest.py and ini files and keeps the workdir off the front of sys.path."""
    import json
    import subprocess
    import sys

    from collect.sandbox.bwrap import TASK_TOOLS
    from tests.fixtures.redteam import PASS_ALL_CONFTEST

    task = TOY / "fix-sum-to"
    work, vdir = tmp_path / "app", tmp_path / "verifier"
    shutil.copytree(task / "environment", work)
    vdir.mkdir()
    (work / plant).write_text({
        "conftest.py": PASS_ALL_CONFTEST,
        "pytest.ini": "[pytest]\naddopts = --deselect test_task.py::test_sum_to\n",
        "pytest.py": "import sys\nprint('PASSED test_task.py::test_sum_to')\nsys.exit(0)\n",
        "sitecustomize.py": "import os\nos.environ['PYTEST_ADDOPTS'] = '--deselect test_task.py::test_sum_to'\n",
    }[plant])
    env = {**os.environ, "WHARF_PYTHON": sys.executable, "WHARF_TESTS_DIR": str(task / "tests"),
           "WHARF_VERIFIER_DIR": str(vdir), "PYTHONPATH": str(work)}
    p = subprocess.run(["bash", str(TASK_TOOLS / "grade_pytest.sh"), str(work), "test_task.py"], env=env,
                       capture_output=True, text=True, timeout=120)
    reward = json.loads((vdir / "reward.json").read_text())
    assert reward["reward"] == 0.0 and reward["f2p_total"] == 1, p.stdout[-2000:] + p.stderr[-2000:]
    # and the unplanted, fixed task still grades 1
    (work / plant).unlink()
    (work / "mathutil.py").write_text((work / "mathutil.py").read_text().replace("range(1, n)", "range(1, n + 1)"))
    vdir2 = tmp_path / "verifier2"
    vdir2.mkdir()
    subprocess.run(["bash", str(TASK_TOOLS / "grade_pytest.sh"), str(work), "test_task.py"],
                   env={**env, "WHARF_VERIFIER_DIR": str(vdir2)}, timeout=120)
    assert json.loads((vdir2 / "reward.json").read_text())["reward"] == 1.0
