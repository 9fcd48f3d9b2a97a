"""The bundled toy task set: well-formed, and real harbor trials in the bwrap sandbox grade the
reference solution 1.0 and an untouched repo 0.0 on every task."""
from __future__ import annotations

import asyncio
import json
import shutil
import tomllib
from pathlib import Path

import pytest

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


async def _run_trials(agent: str, tmp_path: Path, concurrency: int = 2) -> dict[str, dict]:
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    sem = asyncio.Semaphore(concurrency)

    async def one(task: Path) -> tuple[str, dict]:
        cfg = TrialConfig(
            task=TaskConfig(path=task),
            trial_name=f"{task.name}__{agent}",
            trials_dir=tmp_path / "trials",
            agent=AgentConfig(name=agent),
            environment=EnvironmentConfig(
                import_path="collect.sandbox.bwrap:BwrapEnvironment",
                kwargs={"state_dir": str(tmp_path / "state")},
            ),
        )
        async with sem:
            result = await (await Trial.create(cfg)).run()
        assert result.exception_info is None, f"{task.name}: {result.exception_info}"
        return task.name, result.verifier_result.rewards

    return dict(await asyncio.gather(*(one(t) for t in TASKS)))


@needs_bwrap
@pytest.mark.slow
def test_oracle_solves_every_task_and_nop_none(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")
    oracle = asyncio.run(_run_trials("oracle", tmp_path / "oracle"))
    assert {k: v["reward"] for k, v in oracle.items()} == {t.name: 1.0 for t in TASKS}
    nop = asyncio.run(_run_trials("nop", tmp_path / "nop"))
    # an untouched repo: the FAIL_TO_PASS test fails, PASS_TO_PASS passes, the log is gradable
    for name, rewards in nop.items():
        assert (rewards["reward"], rewards["log_ok"], rewards["p2p_passed"]) == (0.0, 1, 1), name
    # the sandboxes are gone
    assert not any((tmp_path / "oracle" / "state").iterdir())
    # the verifier's log and grading story land in the trial dir
    verifier = tmp_path / "oracle" / "trials" / "sed-add__oracle" / "verifier"
    assert ">>>>> Test Exit Code: 0" in (verifier / "test_output.log").read_text()
    assert json.loads((verifier / "grading.json").read_text())["resolved"] is True
