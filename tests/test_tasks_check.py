"""`wharf tasks check`: a task dir's format (a broken one is one line, exit 2, nothing written),
the exploits of the audit's tier 1 as code, and real checks of task dirs in the bwrap sandbox: the
bundled tasks pass, a task whose weak test accepts a deleted body fails with that reason, a task
whose oracle does not solve it fails, and the red team's attackers aim at any task."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import needs_bwrap
from wharf.pipeline.taskcheck.cli import main as check_main
from wharf.tasks.check.exploits import exploits
from wharf.tasks.check.targets import changed_lines, targets
from wharf.tasks.check.taskformat import read_task

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "datasets" / "toy"
PYTEST_TASK = REPO / "tests" / "fixtures" / "tasks" / "pytest-sum-to"
SUM_TO_DIFF = """diff --git a/mathutil.py b/mathutil.py
--- a/mathutil.py
+++ b/mathutil.py
@@ -3 +3 @@ def sum_to(n):
-    for i in range(1, n):
+    for i in range(1, n + 1):
"""


def copy_task(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _spec(task: Path, **over) -> None:
    path = task / "tests" / "spec.json"
    spec = json.loads(path.read_text())
    spec.update(over)
    path.write_text(json.dumps(spec))


BREAKAGES = {
    "FAIL_TO_PASS missing": (lambda t: _spec(t, FAIL_TO_PASS=None), "spec.json: FAIL_TO_PASS must be a list"),
    "FAIL_TO_PASS empty": (lambda t: _spec(t, FAIL_TO_PASS=[]), "spec.json: FAIL_TO_PASS is empty"),
    "PASS_TO_PASS a string": (lambda t: _spec(t, PASS_TO_PASS="contest.py::mean"), "spec.json: PASS_TO_PASS must be a list"),
    "a test in both": (lambda t: _spec(t, PASS_TO_PASS=["contest.py::sum_to"]), "both name 'contest.py::sum_to'"),
    "spec not JSON": (lambda t: (t / "tests" / "spec.json").write_text("{oops"), "spec.json: not valid JSON"),
    "no oracle": (lambda t: (t / "solution" / "solve.sh").unlink(), "solution: holds neither solve.sh nor a *.patch"),
    "unknown judge": (lambda t: (t / "task.toml").write_text((t / "task.toml").read_text().replace('"contest"', '"nope"')),
                      "task.toml: [metadata] judge = 'nope' is not a judge"),
    "a Dockerfile": (lambda t: (t / "environment" / "Dockerfile").write_text("FROM x\n"), "Dockerfile: a Docker task"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_task_dir_is_one_line_exit_2_and_nothing_written(tmp_path, monkeypatch, capsys, breakage):
    """Checked before any trial: one line naming the file (and field), exit 2, no report, even
    beside a good task dir."""
    good, bad = TOY / "fix-is-even", copy_task(TOY / "fix-sum-to", tmp_path / "tasks" / "fix-sum-to")
    breaks, words = BREAKAGES[breakage]
    breaks(bad)
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "out" / "report.json"
    assert check_main([str(good), str(bad), "--report", str(report)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert words in err and str(bad) in err, err
    assert not report.parent.exists() and not (tmp_path / "runs").exists()


def test_task_dirs_expand_a_dataset_and_read_every_bundled_format():
    from wharf.tasks.check.taskformat import task_dirs

    toy = task_dirs([TOY])
    assert len(toy) == len([p for p in TOY.iterdir() if (p / "task.toml").is_file()]) >= 8
    kinds = {read_task(t).judge for t in toy + task_dirs([REPO / "datasets" / "multiturn"]) + [PYTEST_TASK]}
    assert kinds == {"contest", "checker", "pytest"}
    assert read_task(PYTEST_TASK).fail_to_pass == ("test_task.py::test_sum_to",)


def test_the_oracles_diff_names_the_function_under_test():
    assert changed_lines(SUM_TO_DIFF) == {"mathutil.py": {3}}
    (found,) = targets(SUM_TO_DIFF, PYTEST_TASK / "environment")
    assert found.path == "mathutil.py" and [f.qualname for f in found.functions] == ["sum_to"]
    # a pure insertion, a method, a new file and a deleted one
    src = 'class A:\n    def m(self):\n        """Doc."""\n        return 1\n\n\ndef g():\n    return 2\n'
    from wharf.tasks.check.targets import touched_functions

    assert [f.qualname for f in touched_functions(src, {4})] == ["A.m"]
    assert touched_functions(src, {4})[0].body_start == 4  # the docstring is kept
    diff = ("diff --git a/new.txt b/new.txt\nnew file mode 100644\n--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+x\n"
            "diff --git a/old.py b/old.py\ndeleted file mode 100644\n--- a/old.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n")
    assert changed_lines(diff) == {"new.txt": {0, 1}}


def _run_module(tmp_path: Path, text: str, call: str) -> subprocess.CompletedProcess:
    (tmp_path / "mathutil.py").write_text(text)
    return subprocess.run([sys.executable, "-c", f"import mathutil; print(repr({call}))"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


def test_each_tier1_exploit_does_what_it_says(tmp_path):
    found = targets(SUM_TO_DIFF, PYTEST_TASK / "environment")
    made = {e.name: e.files["mathutil.py"] for e in exploits(found, PYTEST_TASK / "environment")}
    assert set(made) == {"always_equal", "skip", "xfail", "body_deleted", "exit_at_import"}
    eq = _run_module(tmp_path, made["always_equal"], "(mathutil.sum_to(3) == 6, mathutil.sum_to(3) == [], mathutil.mean([2]))")
    assert eq.stdout.strip() == "(True, True, 2.0)", eq.stderr  # the other function untouched
    assert _run_module(tmp_path, made["body_deleted"], "mathutil.sum_to(3)").stdout.strip() == "None"
    gone = _run_module(tmp_path, made["exit_at_import"], "'reached'")
    assert gone.returncode == 0 and gone.stdout == ""
    skip = _run_module(tmp_path, made["skip"], "mathutil.sum_to(3)")
    assert "Skipped" in skip.stderr, skip.stderr
    # after a module docstring and `from __future__`: the module still compiles
    from wharf.tasks.check.exploits import EXIT_AT_IMPORT, insert_at_top

    text = insert_at_top('"""Doc."""\nfrom __future__ import annotations\nX = 1\n', EXIT_AT_IMPORT)
    assert text.index("__future__") < text.index("_exit") < text.index("X = 1")
    compile(text, "m.py", "exec")


def test_a_checker_tasks_written_file_is_emptied():
    diff = "diff --git a/answer.txt b/answer.txt\nnew file mode 100644\n--- /dev/null\n+++ b/answer.txt\n@@ -0,0 +1 @@\n+p\n"
    env = REPO / "datasets" / "multiturn" / "cat-note" / "environment"
    assert [(e.name, e.files) for e in exploits(targets(diff, env), env)] == [("emptied", {"answer.txt": ""})]


def test_the_red_team_aims_at_any_task_and_its_steps_format():
    """Every attacker's steps take the facts (str.format) for a module with braces in it; the proxy's
    attackers are left to tests/test_redteam.py."""
    from wharf.pipeline.taskcheck.grader import World
    from wharf.tasks.check.targets import Function, Target
    from wharf.tasks.redteam import PROXY_ATTACKS, attacks_for, target_of

    task = read_task(TOY / "fix-sum-to")
    found = [Target("mathutil.py", [Function("sum_to", 3, 5, "    ")])]
    target = target_of(task, found)
    assert (target.module, target.functions, target.test_files) == ("mathutil.py", ("sum_to",), ("contest.py",))
    made = attacks_for(task, found)
    assert not set(PROXY_ATTACKS) & set(made) and {"always_equal", "plugin_via_gc", "kill_grader", "conftest"} <= set(made)
    facts = World(Path("/nonexistent")).facts()
    for name, steps in made.items():
        for step in steps:
            step.format(**facts)
    assert "def sum_to(n):" in made["kill_grader"][0].format(**facts)


# ---- real checks in the bwrap sandbox ---------------------------------------------------------

HACKABLE_MODULE = "def last(xs):\n    return xs[0]\n\n\ndef first(xs):\n    return xs[0]\n"
# A weak assertion: it rules out the bug's answer only, so `last` returning None passes too.
HACKABLE_TESTS = ("from listutil import last, first\n\n\ndef test_last():\n    assert last([1, 2, 3]) != 1\n\n\n"
                  "def test_first():\n    assert first([1, 2, 3]) == 1\n")


def hackable_task(root: Path) -> Path:
    task = copy_task(PYTEST_TASK, root / "pytest-weak-last")
    (task / "environment" / "mathutil.py").unlink()
    (task / "environment" / "listutil.py").write_text(HACKABLE_MODULE)
    (task / "tests" / "test_task.py").write_text(HACKABLE_TESTS)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\nset -e\ncd /app\nsed -i '2s/xs\\[0\\]/xs[-1]/' listutil.py\n")
    (task / "instruction.md").write_text("last(xs) in listutil.py returns the first item. Fix it.\n")
    _spec(task, FAIL_TO_PASS=["test_task.py::test_last"], PASS_TO_PASS=["test_task.py::test_first"])
    return task


@needs_bwrap
@pytest.mark.slow
def test_a_weak_test_that_accepts_a_deleted_body_fails_the_check(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")
    task, report = hackable_task(tmp_path), tmp_path / "report.json"
    assert check_main([str(task), "--runs", "1", "--report", str(report)]) == 1
    out = capsys.readouterr().out
    assert "pytest-weak-last: FAILED: tier1 exploit body_deleted scored 1 (listutil.py:last: body -> pass)" in out, out
    (verdict,) = json.loads(report.read_text())["verdicts"]
    scores = {t["change"]: t["reward"] for t in verdict["trials"]}
    assert scores["oracle"] == 1.0 and scores["nop"] == 0.0 and scores["body_deleted"] == 1.0, scores
    assert scores["exit_at_import"] == 0.0 and set(verdict["seconds"]) == {"format", "judge", "tier1"}


@needs_bwrap
@pytest.mark.slow
def test_an_oracle_that_does_not_solve_fails_and_the_bundled_tasks_pass(tmp_path, monkeypatch, capsys):
    """A contest and a checker task pass with their oracle run twice; a task whose solve.sh fixes
    nothing fails on its oracle, and the audit is not run on it."""
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")
    broken = copy_task(TOY / "fix-sum-to", tmp_path / "unsolved")
    (broken / "solution" / "solve.sh").write_text("#!/bin/bash\ncd /app\necho 'nothing to fix' > notes.txt\n")
    tasks = [TOY / "fix-sum-to", REPO / "datasets" / "multiturn" / "cat-note", broken]
    report = tmp_path / "report.json"
    assert check_main([*map(str, tasks), "--runs", "2", "--report", str(report)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0] for ln in lines[:3]] == ["fix-sum-to", "cat-note", "unsolved"]
    assert all(": ok  [" in ln for ln in lines[:2]), lines
    assert "unsolved: FAILED: the oracle scored [0, 0] over 2 runs, want 1.0 each" in lines[2], lines
    data = json.loads(report.read_text())
    assert (data["tasks"], data["failed"], data["ok"]) == (3, 1, False)
    assert [t["change"] for t in data["verdicts"][1]["trials"] if t["tier"] == "tier1"] == ["emptied"]
    unsolved = data["verdicts"][2]
    assert "tier1" not in unsolved["seconds"] and {t["change"] for t in unsolved["trials"]} == {"oracle", "nop"}
    ok = data["verdicts"][0]
    assert {t["change"] for t in ok["trials"] if t["tier"] == "tier1"} == {
        "always_equal", "skip", "xfail", "body_deleted", "exit_at_import"}
    assert all(t["reward"] == 0.0 for t in ok["trials"] if t["tier"] == "tier1")


def test_the_audit_stops_where_a_stage_fails_and_names_each_exploit_that_scored():
    """The order of the check against a grader double that answers from a table (the real
    grader is the bwrap trials of the slow tests below)."""
    import asyncio

    from wharf.tasks.check.audit import check
    from wharf.tasks.check.records import Trial

    task = read_task(PYTEST_TASK)

    def grader(scores: dict[str, float | None], rc: int = 0):
        async def grade(_task, changes):
            return [Trial(c.name, scores.get(c.name, 0.0), None if scores.get(c.name, 0.0) is not None else "boom",
                          diff=SUM_TO_DIFF if c.oracle else "", output=f"oracle_rc={rc}" if c.oracle else "",
                          run=c.run, tier=c.tier) for c in changes]
        return grade

    ok = asyncio.run(check(task, grader({"oracle": 1.0}), runs=2))
    assert ok.ok and ok.reasons == [] and {t.change for t in ok.trials if t.tier == "tier1"} == {
        "always_equal", "skip", "xfail", "body_deleted", "exit_at_import"}
    bad = asyncio.run(check(task, grader({"oracle": 0.0}, rc=3), runs=2))
    assert bad.reasons == ["the oracle scored [0, 0] over 2 runs, want 1.0 each; the oracle exited 3"]
    assert "tier1" not in bad.seconds  # no audit of a task its oracle does not solve
    hacked = asyncio.run(check(task, grader({"oracle": 1.0, "skip": 1.0, "xfail": None}), runs=1))
    assert not hacked.ok and hacked.reasons == [
        "tier1 exploit skip scored 1 (mathutil.py:sum_to: body -> import pytest; pytest.skip('tasks check: skipped'))",
        "tier1 xfail: the judge wrote no reward (boom)"]
    assert hacked.line().startswith("pytest-sum-to: FAILED: tier1 exploit skip scored 1") and "(+1 more)" in hacked.line()
    flips = asyncio.run(check(task, grader({"oracle": 1.0, "nop": 1.0}), runs=1))
    assert flips.reasons == ["the untouched workspace scored [1] over 1 runs, want 0 each"]
