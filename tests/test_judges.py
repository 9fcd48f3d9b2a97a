"""The checker and contest judges (wharf/tasks/tools/judge.py) run as a task's test.sh runs them,
outside a sandbox, and the task format that names a task's judge (wharf/tasks/judges.py)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from wharf.tasks.judges import TaskJudgeError, check_task, judge_of

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "wharf" / "tasks" / "tools"
CONTEST = ROOT / "datasets" / "toy" / "fix-sum-to"
CHECKER = ROOT / "tests" / "fixtures" / "tasks" / "checker-sum-to"


def judge(tmp: Path, task: Path, mathutil: str | None = None, hide: bool = False, plant=None) -> tuple[dict, dict]:
    """judge.sh on a copy of the task; `hide`: as in the sandbox, the tests dir's files go once read."""
    work, tests, out = tmp / "app", tmp / "tests", tmp / "verifier"
    shutil.copytree(task / "environment", work)
    shutil.copytree(task / "tests", tests)
    out.mkdir()
    (tests / ".wharf-reward-key").write_text("k" * 64)
    if mathutil is not None:
        (work / "mathutil.py").write_text(mathutil)
    if plant:
        plant(work)
    kind = judge_of(task).kind
    env = {"PATH": os.defpath, "HOME": str(tmp), "WHARF_PYTHON": sys.executable, "WHARF_VERIFIER_DIR": str(out),
           "WHARF_TEST_TIMEOUT": "10", **({} if hide else {"WHARF_TESTS_DIR": str(tests)})}
    script = f"bash {TOOLS}/judge.sh {kind} {work}"
    if hide:  # judge.sh hides /tests only: point it at our copy the way the sandbox lays it out
        script = script.replace(f"{TOOLS}/judge.sh", str(tmp / "judge.sh"))
        (tmp / "judge.sh").write_text((TOOLS / "judge.sh").read_text().replace('TOOLS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"', f'TOOLS={TOOLS}')
                                      .replace('"${WHARF_TESTS_DIR:-/tests}"', str(tests)))
    p = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert not (tests / ".wharf-reward-key").exists()  # taken before any code under test ran
    return json.loads((out / "reward.json").read_text()), json.loads((out / "grading.json").read_text())


FIXED = (CONTEST / "environment" / "mathutil.py").read_text().replace("range(1, n)", "range(1, n + 1)")


@pytest.mark.parametrize("task", [CONTEST, CHECKER], ids=["contest", "checker"])
def test_the_fix_gets_1_the_bug_0_and_a_print_in_the_code_changes_nothing(tmp_path, task):
    fixed, _ = judge(tmp_path / "fix", task, "print('hello from the code under test')\n" + FIXED)
    assert (fixed["reward"], fixed["f2p_passed"], fixed["p2p_passed"], fixed["timed_out"]) == (1.0, 1, 1, 0)
    bug, detail = judge(tmp_path / "bug", task)
    assert (bug["reward"], bug["f2p_passed"], bug["p2p_passed"]) == (0.0, 0, 1)
    if task is CONTEST:  # the story names a drawn input, the answer and what was expected
        wrong = detail["checks"]["contest.py::sum_to"]["first_wrong"]
        assert wrong["answer"]["value"] != wrong["expected"] and detail["seed"] >= 0


def test_the_inputs_are_drawn_afresh_and_a_solution_fitted_to_the_visible_ones_gets_0(tmp_path):
    fitted = "def sum_to(n):\n    return {3: 6, 1: 1}.get(n, 0)\n\n\ndef mean(xs):\n    return sum(xs) / len(xs)\n"
    r, _ = judge(tmp_path / "a", CONTEST, fitted)
    assert (r["reward"], r["f2p_passed"]) == (0.0, 0)
    _, d1 = judge(tmp_path / "b", CONTEST, FIXED)
    _, d2 = judge(tmp_path / "c", CONTEST, FIXED)
    assert d1["seed"] != d2["seed"]


def test_the_spec_is_gone_before_the_code_under_test_runs(tmp_path):
    # the code under test looks for the reference at import: it must find the tests dir empty
    # (confined, a tests dir under /tmp is not even in its view: the host's /tmp is not its /tmp)
    where = str(tmp_path / "tests")
    steal = f"import os\nSEEN = os.path.isdir({where!r}) and os.listdir({where!r})\nassert not SEEN, SEEN\n" + FIXED
    r, _ = judge(tmp_path, CONTEST, steal, hide=True)
    assert r["reward"] == 1.0
    assert os.listdir(tmp_path / "tests") == []


def test_a_checker_reads_no_link_out_of_the_workspace_and_no_fifo(tmp_path):
    task = ROOT / "datasets" / "learn" / "echo-color"
    outside = tmp_path / "outside.txt"
    outside.write_text("blue\n")

    def link(work):
        (work / "color.txt").symlink_to(outside)
    r, d = judge(tmp_path / "link", task, plant=link)
    assert r["reward"] == 0.0 and "outside the workspace" in d["checks"]["check.py::test_result"]["why"]
    r, d = judge(tmp_path / "fifo", task, plant=lambda work: os.mkfifo(work / "color.txt"))
    assert r["reward"] == 0.0 and "not a regular file" in d["checks"]["check.py::test_result"]["why"]


@pytest.mark.slow
def test_a_hung_call_is_killed_at_the_timeout(tmp_path):
    r, _ = judge(tmp_path, CONTEST, "import time\ntime.sleep(3600)\n" + FIXED)
    assert (r["reward"], r["timed_out"]) == (0.0, 1)


def test_the_task_format_names_the_judge_and_a_task_that_lacks_its_files_is_refused(tmp_path):
    assert judge_of(CONTEST).kind == "contest" and judge_of(CHECKER).kind == "checker"
    assert check_task(ROOT / "tests" / "fixtures" / "tasks" / "answer").kind == "pytest"  # no key: pytest
    task = tmp_path / "t"
    shutil.copytree(CONTEST, task)
    (task / "tests" / "contest.py").unlink()
    with pytest.raises(TaskJudgeError, match="needs tests/contest.py"):
        check_task(task)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace('judge = "contest"', 'judge = "oracle"'))
    with pytest.raises(TaskJudgeError, match="is not a judge"):
        check_task(task)


def test_a_hostile_answer_is_a_wrong_answer_with_its_reason_never_a_crash(tmp_path):
    # a 400-digit int where a float is expected: math.isclose raises OverflowError in the grader
    huge = FIXED.replace("return sum(xs) / len(xs)", "return 10 ** 400")
    assert huge != FIXED
    r, d = judge(tmp_path, CONTEST, huge)
    assert (r["reward"], r["f2p_passed"], r["p2p_passed"]) == (0.0, 1, 0)
    wrong = d["checks"]["contest.py::mean"]["first_wrong"]
    assert "OverflowError" in wrong["why"] and wrong["answer"]["value"] == 10 ** 400


def test_a_comparison_that_raises_or_an_answer_too_big_to_show_stays_data():
    sys.path.insert(0, str(TOOLS))
    try:
        import judge as judge_py
    finally:
        sys.path.remove(str(TOOLS))
    deep, other = [], [1]
    for _ in range(5000):  # deeper than the comparison's and the encoder's recursion
        deep, other = [deep], [other]
    assert "RecursionError" in judge_py.disagree(judge_py.same, {"value": deep}, other)
    assert "OverflowError" in judge_py.disagree(judge_py.same, {"value": 10 ** 400}, 2.0)
    assert judge_py.disagree(judge_py.same, {"value": 2.0}, 2.0) is None
    assert judge_py.disagree(judge_py.same, {"error": "boom"}, 2.0) is not None
    shown = judge_py.shown({"value": deep})
    assert set(shown) == {"shortened"} and len(shown["shortened"]) <= 2000
    assert judge_py.shown([1, 2]) == [1, 2]


def test_the_verdict_is_macd_as_serialised_never_as_re_read_from_the_dir(tmp_path, monkeypatch):
    # a forger rewrites reward.json right after the grader renames it into place (it stopped the
    # grader there): the MAC is of the bytes the grader made, so the forged file does not verify
    from wharf.collect.sandbox import rewardproof
    sys.path.insert(0, str(TOOLS))
    try:
        import judge_io
    finally:
        sys.path.remove(str(TOOLS))
    forged = b'{"reward": 1.0}\n'
    real_replace = os.replace

    def replace_then_forge(src, dst):
        real_replace(src, dst)
        if str(dst).endswith("reward.json"):
            Path(dst).write_bytes(forged)
    monkeypatch.setattr(judge_io.os, "replace", replace_then_forge)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("keep")
    out = tmp_path / "verifier"
    out.mkdir()
    (out / "reward.json.tmp").symlink_to(elsewhere)  # planted: written through, it would change `elsewhere`
    key = b"k" * 64
    judge_io.write_verdict(str(out), {"reward": 0.0}, {"checks": {}}, key)
    assert (out / "reward.json").read_bytes() == forged and elsewhere.read_text() == "keep"
    assert "does not verify" in rewardproof.why_not(out, key)
    monkeypatch.setattr(judge_io.os, "replace", real_replace)
    judge_io.write_verdict(str(out), {"reward": 0.0}, {"deep": [[[]]] * 2}, key)
    assert rewardproof.why_not(out, key) is None and json.loads((out / "reward.json").read_text()) == {"reward": 0.0}


def _jail():
    sys.path.insert(0, str(TOOLS))
    try:
        import jail
    finally:
        sys.path.remove(str(TOOLS))
    return jail


def _alive_with(marker: str) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(int(pid))
        except OSError:
            continue
    return out


# A chain that moves: each link forks the next and exits, so the tree outlives every parent
# (what beat the bounded walk over the grader's children); a daemon in a new session beside it.
CHAIN = """import os, subprocess, sys, time
subprocess.Popen(["sleep", "300", sys.argv[1]], start_new_session=True)
if os.fork():
    time.sleep(300)  # the code under test itself, still running when the grader ends it
while True:
    if os.fork():
        os._exit(0)
    os.setsid()
    time.sleep(0.005)
"""


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_the_code_under_test_cannot_see_signal_or_outlive_the_grader(tmp_path):
    import subprocess as sp
    import time

    jail = _jail()
    assert jail.unavailable() is None, jail.unavailable()
    marker = f"wharf-jail-{os.getpid()}-{time.monotonic_ns()}"
    (tmp_path / "chain.py").write_text(CHAIN)
    run = jail.start([sys.executable, "-I", str(tmp_path / "chain.py"), marker], str(tmp_path), sys.executable,
                     stdout=sp.DEVNULL, stderr=sp.DEVNULL)
    time.sleep(0.5)
    assert _alive_with(marker), "the daemon runs while the code under test does"
    assert jail.end(run) is None
    assert _alive_with(marker) == [] and _alive_with(str(tmp_path / "chain.py")) == []
    # what it can see and signal: its own namespace only (init, sh, ls, grep); the grader's files read-only
    # (its tools dir, not the checkout's root: a checkout under /tmp sits on the jail's own tmpfs there)
    probe = (f"ls /proc | grep -c '^[0-9]'; kill -STOP {os.getpid()} || echo no-signal; "
             f"touch {tmp_path}/w && echo workdir-rw; touch {TOOLS}/x 2>/dev/null || echo tools-ro; "
             "unshare -U true 2>/dev/null || echo no-userns")
    run = jail.start(["sh", "-c", probe], str(tmp_path), sys.executable, stdout=sp.PIPE, stderr=sp.DEVNULL)
    out = run.proc.communicate(timeout=30)[0].decode().split("\n")
    assert jail.end(run) is None
    assert int(out[0]) <= 4 and out[1:5] == ["no-signal", "workdir-rw", "tools-ro", "no-userns"], out
    assert os.path.exists(tmp_path / "w") and not os.path.exists(TOOLS / "x")


def test_a_child_that_prints_gigabytes_costs_the_grader_no_memory(tmp_path):
    # 64 MiB on stderr at import (call_child sends prints there): the grader keeps its tail only
    loud = "import os\nfor _ in range(64):\n    os.write(2, b'x' * (1 << 20))\n" + FIXED
    r, d = judge(tmp_path, CONTEST, loud.replace("return sum(xs) / len(xs)", "return 0.5"))
    assert (r["reward"], r["f2p_passed"], r["p2p_passed"]) == (0.0, 1, 0)
    assert d["checks"]["contest.py::mean"]["first_wrong"]["stderr"] == "x" * 500


NO_ENV_TEST_SH = """#!/bin/bash
# pytest-sum-to graded in a package env the sandbox does not show (a made task's test.sh, its env
# not bound): the tests never start
cd /app || exit 1
exec "${WHARF_PYTHON:-python3}" -I "$WHARF_TASK_TOOLS/pytest_grade.py" --spec /tests/spec.json --out /logs/verifier \\
    --timeout 30 --python /opt/wharf-no-such-env/bin/python --reward-key /tests/.wharf-reward-key --workdir /app \\
    --tests-dir /tests --test-file test_task.py -- -rA --noconftest -c /dev/null
"""


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
def test_a_trial_whose_tests_never_start_is_a_verifier_error_with_the_reason_not_a_0(tmp_path, monkeypatch):
    """A real harbor trial in the bubblewrap sandbox: the pytest judge finds no interpreter for the
    tests, so it signs its reason instead of a reward; the sandbox keeps no reward (no 0 from the
    reward proof), and the rollout is a verifier error whose error leads with the judge's line."""
    import asyncio

    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial
    from wharf.collect.trials import classify, with_judge_reason

    monkeypatch.setenv("HARBOR_TELEMETRY", "0")
    task = tmp_path / "pytest-no-env"
    shutil.copytree(ROOT / "tests/fixtures/tasks/pytest-sum-to", task)
    (task / "tests" / "test.sh").write_text(NO_ENV_TEST_SH)
    cfg = TrialConfig(task=TaskConfig(path=task), trial_name="no-env", trials_dir=tmp_path / "trials",
                      agent=AgentConfig(name="nop"),
                      environment=EnvironmentConfig(import_path="wharf.collect.sandbox.bwrap:BwrapEnvironment",
                                                    kwargs={"state_dir": str(tmp_path / "state")}))

    async def run():
        return await (await Trial.create(cfg)).run()
    result = asyncio.run(run())
    verifier = tmp_path / "trials" / "no-env" / "verifier"
    outcome = with_judge_reason(classify(result), tmp_path / "trials" / "no-env")
    assert outcome.status == "verifier_error" and outcome.reward is None, (outcome, sorted(os.listdir(verifier)))
    assert outcome.error.startswith("verifier error: the tests never started") and "RewardFileNotFound" in outcome.error
    assert "/opt/wharf-no-such-env/bin/python" in outcome.error
    assert not (verifier / "reward.json").exists() and not (verifier / "reward_rejected.txt").exists()
    assert "the tests never started" in (verifier / "test-stdout.txt").read_text()


def test_only_the_graders_signed_error_drops_the_reward_a_planted_one_is_still_a_0(tmp_path):
    """The code under test can write /logs/verifier where unconfined, but not MAC with the key the
    grader took: its own verifier_error.txt cannot turn its 0 into a dropped trial."""
    from wharf.collect.sandbox import rewardproof
    sys.path.insert(0, str(TOOLS))
    try:
        import judge_io
    finally:
        sys.path.remove(str(TOOLS))
    key = b"k" * 64
    signed = tmp_path / "signed"
    (signed / "reward.json").parent.mkdir()
    (signed / "reward.json").write_text('{"reward": 1.0}')  # planted before the grader gave up
    judge_io.write_error(str(signed), "verifier error: the tests never started:\n no pytest", {"error": "x"}, key)
    assert rewardproof.judge_error(signed, key) == "verifier error: the tests never started: no pytest"
    assert rewardproof.enforce(signed, key, None) is None and not (signed / "reward.json").exists()
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / rewardproof.JUDGE_ERROR).write_text("verifier error: not mine\n")
    (planted / (rewardproof.JUDGE_ERROR + ".mac")).write_text(rewardproof.mac(b"x" * 64, b"verifier error: not mine\n"))
    assert rewardproof.judge_error(planted, key) is None
    assert "wrote no reward.json" in rewardproof.enforce(planted, key, None)
    assert json.loads((planted / "reward.json").read_text()) == {"reward": 0.0, "reward_rejected": 1}
