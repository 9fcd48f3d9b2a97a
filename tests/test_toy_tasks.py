"""The bundled toy task set: well-formed, judged contest-style (the write-* tasks by a checker),
and real harbor trials in the bwrap sandbox grade the
reference solution 1.0 and an untouched repo 0.0 on every task."""
from __future__ import annotations

import asyncio
import os
import json
import shutil
import tomllib
from pathlib import Path

import pytest

from tests.fixtures.trials import assert_judged_task_dir, grade_tasks

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "datasets" / "toy"
TASKS = sorted(p for p in TOY.iterdir() if (p / "task.toml").is_file())
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


def test_task_set_shape():
    assert 8 <= len(TASKS) <= 12
    difficulties = set()
    for task in TASKS:
        # the function tasks are judged contest-style, the write-a-file tasks by a checker
        assert_judged_task_dir(task, "checker" if task.name.startswith("write-") else "contest")
        difficulties.add(tomllib.loads((task / "task.toml").read_text())["metadata"]["difficulty"])
        assert not (task / "environment" / "Dockerfile").exists()  # the bwrap sandbox cannot build one
    assert difficulties == {"easy", "medium", "hard"}


def test_tasks_grade_with_the_shared_tools():
    """One grader for every task: test.sh runs wharf/tasks/tools/judge.sh (exported by the sandbox as
    WHARF_TASK_TOOLS), never a copy that could go stale."""
    for task in TASKS:
        script = (task / "tests" / "test.sh").read_text()
        assert '"${WHARF_TASK_TOOLS:-/tests}/judge.sh"' in script, task.name
        assert not (task / "tests" / "grading.py").exists(), task.name


def test_contest_references_agree_with_the_oracle_fix(tmp_path):
    """Each contest spec's reference answers its drawn inputs as the oracle's fixed module does
    (the buggy one does not), so a 1.0 means the fix and a 0.0 the bug, not a wrong reference."""
    import random
    import subprocess
    import sys

    for task in (t for t in TASKS if not t.name.startswith("write-")):
        spec: dict = {}
        exec((task / "tests" / "contest.py").read_text(), spec)
        for fixed in (False, True):
            work = tmp_path / f"{task.name}-{fixed}"
            shutil.copytree(task / "environment", work)
            if fixed:
                script = (task / "solution" / "solve.sh").read_text().replace("cd /app", f"cd {work}")
                subprocess.run(["bash", "-c", script], check=True)
            wrong = 0
            for name, check in spec["CHECKS"].items():
                inputs = check["inputs"](random.Random(0))
                module = check.get("module", spec["MODULE"])
                code = (f"import sys, json; sys.path.insert(0, {str(work)!r}); import {module} as m; "
                        f"print(json.dumps([m.{name}(*a) for a in {inputs!r}]))")
                got = json.loads(subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                                                check=True).stdout)
                same = check.get("same", lambda g, w: g == w)
                wrong += sum(not same(g, check["reference"](*a)) for g, a in zip(got, inputs))
            assert (wrong == 0) == fixed, (task.name, fixed, wrong)


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
    # the verdict and its story land in the trial dir: contest checks drawn afresh, answered in /app
    verifier = tmp_path / "oracle" / "trials" / "sed-add__oracle" / "verifier"
    detail = json.loads((verifier / "grading.json").read_text())
    assert detail["resolved"] is True and detail["grader"] == "contest"
    assert detail["checks"]["contest.py::add"]["cases"] > 10


@pytest.mark.slow
@pytest.mark.parametrize("plant", ["conftest.py", "pytest.ini", "pytest.py", "sitecustomize.py"])
def test_grade_pytest_ignores_planted_test_config_outside_the_sandbox(tmp_path, plant):
    """Where no sandbox sets the agent's test config aside (Docker), the grader itself ignores
    conftest.py and ini files and keeps the workdir off the front of sys.path."""
    import json
    import subprocess
    import sys

    from wharf.collect.sandbox.bwrap import TASK_TOOLS
    from tests.fixtures.redteam import PASS_ALL_CONFTEST

    task = REPO / "tests" / "fixtures" / "tasks" / "pytest-sum-to"
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
