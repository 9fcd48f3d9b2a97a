"""The held-out splits (datasets/multiturn/heldout, datasets/learn/heldout): the same kinds of task
as the training split with values never trained on, at least as many instances, written by the
set's make_tasks.py and graded by the checker judge like the training tasks; real harbor trials
grade their reference solution 1.0 and an untouched sandbox 0.0. datasets/multiturn/train, the
larger training split, is written the same way with values new to both."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from wharf.collect.tasksets import discover
from tests.fixtures.trials import assert_judged_task_dir, assert_oracle_1_nop_0

REPO = Path(__file__).resolve().parents[1]
SETS = ["multiturn", "learn"]


def tasks(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if (p / "task.toml").is_file())


def answer(task: Path) -> str:
    """The value test_result asks for (multiturn: `== 'value'`)."""
    return re.search(r"== '([^']*)'", (task / "tests" / "check.py").read_text()).group(1)


def command(task: Path) -> str:
    return (task / "solution" / "solve.sh").read_text().strip().splitlines()[-1]


@pytest.mark.parametrize("name", SETS)
def test_heldout_has_every_kind_and_no_fewer_instances(name):
    train, held = tasks(REPO / "datasets" / name), tasks(REPO / "datasets" / name / "heldout")
    assert len(held) >= len(train) == 8
    assert {re.sub(r"-\d+$", "", t.name) for t in held} == {t.name for t in train}
    for t in held:
        spec = assert_judged_task_dir(t, "checker")
        assert spec["FAIL_TO_PASS"] == ["check.py::test_result"], t.name
        assert spec["PASS_TO_PASS"] == ["check.py::test_kept"], t.name


@pytest.mark.parametrize("name", SETS)
def test_collect_accepts_the_heldout_split(name):
    """collect's task loading (and its judge check) takes the split as collect.dataset."""
    held = REPO / "datasets" / name / "heldout"
    assert [t.path for t in discover(held)] == [t.resolve() for t in tasks(held)]


def skeleton(check: Path) -> str:
    """check.py with its values (strings, numbers) blanked out."""
    return re.sub(r'"[^"]*"|\b\d+\b', "_", check.read_text())


def test_learn_heldout_checks_are_the_training_checks_with_other_values():
    learn = REPO / "datasets" / "learn"
    for t in tasks(learn / "heldout"):
        train = learn / re.sub(r"-\d+$", "", t.name)
        assert skeleton(t / "tests" / "check.py") == skeleton(train / "tests" / "check.py"), t.name
        assert (t / "tests" / "test.sh").read_text() == (train / "tests" / "test.sh").read_text()
        # the same task.toml but for the family line (eval's intervals cluster by it): the kind
        held_toml = (t / "task.toml").read_text()
        assert f'family = "{train.name}"\n' in held_toml, t.name
        assert re.sub(r'family = "[^"]*"\n', "", held_toml) == (train / "task.toml").read_text(), t.name


def test_multiturn_train_split_has_two_new_instances_of_every_kind():
    mt = REPO / "datasets" / "multiturn"
    split = tasks(mt / "train")
    assert sorted(t.name for t in split) == sorted(f"{k.name}-t{i}" for k in tasks(mt) for i in (1, 2))
    for t in split:
        spec = assert_judged_task_dir(t, "checker")
        assert spec["FAIL_TO_PASS"] == ["check.py::test_result"], t.name
        assert f'family = "{t.name[:-3]}"\n' in (t / "task.toml").read_text(), t.name
        assert answer(t) not in (t / "instruction.md").read_text(), t.name
    values = [answer(t) for t in split]
    others = {answer(t) for t in tasks(mt) + tasks(mt / "heldout")}
    assert len(set(values)) == len(values) and not others & set(values)
    assert [t.path for t in discover(mt / "train")] == [t.resolve() for t in split]


def test_no_heldout_value_is_a_training_value():
    mt = REPO / "datasets" / "multiturn"
    train_values = {answer(t) for t in tasks(mt)}
    held_values = [answer(t) for t in tasks(mt / "heldout")]
    assert len(set(held_values)) == len(held_values) and not train_values & set(held_values)
    for t in tasks(mt / "heldout"):  # and, as in training, only the sandbox shows it
        assert answer(t) not in (t / "instruction.md").read_text(), t.name
    learn = REPO / "datasets" / "learn"
    train_cmds = {command(t) for t in tasks(learn)}
    held_cmds = [command(t) for t in tasks(learn / "heldout")]
    assert len(set(held_cmds)) == len(held_cmds) and not train_cmds & set(held_cmds)


@pytest.mark.parametrize("name", SETS)
def test_generator_writes_the_committed_dirs(tmp_path, name):
    """The whole set (training tasks and held-out split, multiturn's train split) is what its
    make_tasks.py writes: the split dirs are removed first, so a stale file there fails too."""
    src = REPO / "datasets" / name
    shutil.copytree(src, tmp_path / name)
    shutil.copy(REPO / "datasets" / "taskdir.py", tmp_path)  # what both generators import
    shutil.rmtree(tmp_path / name / "heldout")
    shutil.rmtree(tmp_path / name / "train", ignore_errors=True)
    subprocess.run([sys.executable, str(tmp_path / name / "make_tasks.py")], check=True, capture_output=True)
    diff = subprocess.run(["diff", "-r", str(src), str(tmp_path / name), "-x", "__pycache__"],
                          capture_output=True, text=True)
    assert diff.returncode == 0, diff.stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_oracle_solves_every_split_task_and_nop_none(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")
    split = [t for name in SETS for t in tasks(REPO / "datasets" / name / "heldout")]
    assert_oracle_1_nop_0(split + tasks(REPO / "datasets" / "multiturn" / "train"), tmp_path)
