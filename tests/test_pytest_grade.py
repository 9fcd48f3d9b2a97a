"""The pytest judge whole (wharf/tasks/tools/pytest_grade.py): grade_pytest.sh run as a task's
test.sh runs it, outside a sandbox, on the honest fix and on attackers that forge the result from
inside the test process (the same ones tests/test_redteam.py runs in the sandbox), and on test
envs and workspaces that cannot run. tests/test_pytest_grade_parts.py takes its parts by hand."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.redteam import BUGGY, FIGHT_ATTACKS, GRADING_ATTACKS, PLUGIN_ATTACKS

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "wharf" / "tasks" / "tools"
TASK = ROOT / "tests" / "fixtures" / "tasks" / "pytest-sum-to"


FIGHT_TIMEOUT = 90  # seconds for a session under an attack that fights the grader (it ends well before)


def _grade(tmp: Path, mathutil: str | None = None, timeout: int = 60, reward_key: bytes | None = None,
           tools: Path = TOOLS, files: dict[str, str] | None = None) -> dict:
    """grade_pytest.sh (from `tools`) on a copy of fix-sum-to (its mathutil.py replaced, `files`
    left in the workspace), as test.sh runs it."""
    work, tests, out = tmp / "app", tmp / "tests", tmp / "verifier"
    shutil.copytree(TASK / "environment", work)
    shutil.copytree(TASK / "tests", tests)
    out.mkdir()
    if reward_key is not None:  # as the sandbox puts it there (wharf/collect/sandbox/rewardproof.py)
        (tests / ".wharf-reward-key").write_bytes(reward_key)
    if mathutil is not None:
        (work / "mathutil.py").write_text(mathutil)
    for name, text in (files or {}).items():
        (work / name).write_text(text)
    env = {"PATH": os.defpath, "HOME": str(tmp), "WHARF_PYTHON": sys.executable, "WHARF_TESTS_DIR": str(tests),
           "WHARF_VERIFIER_DIR": str(out), "WHARF_TEST_TIMEOUT": str(timeout), "OMP_WAIT_POLICY": "PASSIVE"}
    # the marker stops forged_report_files' walk up the process tree below this test's own shell
    cmd = f"bash {tools}/grade_pytest.sh {work} test_task.py; exit $?  # wharf-redteam-top"
    # cwd: the forged-report attacker writes into its processes' cwds; keep the repo root clean
    p = subprocess.run(["bash", "-c", cmd], cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout + 120)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads((out / "reward.json").read_text())


@pytest.mark.slow
def test_the_honest_fix_gets_1_and_the_bug_0(tmp_path):
    key = b"0123456789abcdef" * 4
    fixed = _grade(tmp_path / "fix", BUGGY.replace("range(1, n)", "range(1, n + 1)"), reward_key=key)
    # the grader took the sandbox's key off the disk and signed its reward.json with it
    assert not (tmp_path / "fix" / "tests" / ".wharf-reward-key").exists()
    signed = (tmp_path / "fix" / "verifier" / "reward.json").read_bytes()
    assert (tmp_path / "fix" / "verifier" / "reward.json.mac").read_text().strip() == \
        hmac.new(key, signed, hashlib.sha256).hexdigest()
    assert fixed == {"reward": 1.0, "resolved": 1, "log_ok": 1, "f2p_passed": 1, "f2p_total": 1, "p2p_passed": 1,
                     "p2p_total": 1, "test_exit_code": 0, "grader_pytest_report": 1, "records_ok": 1,
                     "session_finished": 1, "timed_out": 0, "log_reward": 1.0, "recheck": 1, "confined": 1,
                     "sealed": 1}
    # the tests ran in copies: the workspace is as the agent left it, no test file put in it
    assert sorted(p.name for p in (tmp_path / "fix" / "app").iterdir()) == ["mathutil.py"]
    bug = _grade(tmp_path / "bug")
    assert (bug["reward"], bug["records_ok"], bug["f2p_passed"], bug["p2p_passed"]) == (0.0, 1, 0, 1)
    assert bug["recheck"] == -1  # the second run only confirms a resolved verdict


# An honest fix that uses what real code uses and the audit hook must let through: logging (it
# reads frames through sys._getframe), inspect, formatted tracebacks, asyncio (types.coroutine
# replaces a __code__), warnings, threads, asyncio.run (it sets a SIGINT handler and restores it),
# numpy (which goes on without ctypes, refused as a module not there), a gc.collect.
HONEST_INTROSPECTION = """import asyncio, gc, inspect, logging, threading, traceback, warnings
try:
    import numpy  # (a dependency of the trainer's stack: present in the venv)
except ImportError:
    numpy = None
try:
    import ctypes
except ImportError:
    ctypes = None
asyncio.run(asyncio.sleep(0))
logging.getLogger("mathutil").warning("loaded from %s", inspect.currentframe().f_code.co_filename)
try:
    raise ValueError("x")
except ValueError:
    assert "ValueError" in traceback.format_exc()
warnings.warn("a warning", UserWarning)
t = threading.Thread(target=lambda: None)
t.start()
t.join()
gc.collect()
"""


@pytest.mark.slow
def test_honest_code_that_introspects_still_gets_1(tmp_path):
    r = _grade(tmp_path, HONEST_INTROSPECTION + BUGGY.replace("range(1, n)", "range(1, n + 1)"))
    assert (r["reward"], r["records_ok"], r["recheck"]) == (1.0, 1, 1), r


@pytest.mark.slow
@pytest.mark.parametrize("attack", sorted(set(GRADING_ATTACKS) - {"kill_grader"}))  # that one: sandbox only
def test_a_result_forged_from_inside_the_tests_gets_0(tmp_path, attack):
    t0 = time.monotonic()
    # the fights' timers and process chains slow the session itself: ~10 s on a slow 2-core host,
    # where 8 s timed the run out before the bug's own failure was recorded
    r = _grade(tmp_path, GRADING_ATTACKS[attack] + "\n" + BUGGY, timeout=FIGHT_TIMEOUT if attack in FIGHT_ATTACKS else 8)
    assert r["reward"] == 0.0, r
    if attack == "forged_report_files":  # the spec it would rewrite (confined: not in its view) is not graded against
        assert (r["f2p_total"], r["p2p_total"], r["f2p_passed"]) == (1, 1, 0)
    elif attack == "clone_the_call_site":  # its call_and_report runs with its own globals: not pytest's site
        assert (r["records_ok"], r["confined"]) == (0, 1), r
    elif attack in FIGHT_ATTACKS:  # the grader unreachable, the hook's lookups bound: the bug's own failure,
        assert (r["f2p_passed"], r["confined"]) == (0, 1), r  # or a timer or handler they set, seen as tamper
        problems = json.loads((tmp_path / "verifier" / "grading.json").read_text())["problems"]
        assert r["records_ok"] == 1 or any("signal handler" in p or "interval timer" in p for p in problems), problems
    else:
        assert r["records_ok"] == 0, r
    if attack == "plugin_via_ctypes":  # ctypes is not there while the tests run: the module does not import
        assert "import ctypes is refused" in (tmp_path / "verifier" / "test_output.log").read_text()
    elif attack in PLUGIN_ATTACKS or attack == "clone_the_call_site":  # refused (each scored 1.0 before)
        detail = json.loads((tmp_path / "verifier" / "grading.json").read_text())
        assert any("refused" in p or "outside pytest's own call site" in p for p in detail["problems"]), detail
    if attack == "forged_output_exit":  # (patch_reporting did too, until the audit hook refused its gc walk)
        assert r["log_reward"] == 1.0, "the attack should have fooled the log grader"
    if attack == "hang_after_success":
        assert r["timed_out"] == 1 and time.monotonic() - t0 < 60
    time.sleep(1)  # a daemon the attack left would re-plant reward.json now
    assert json.loads((tmp_path / "verifier" / "reward.json").read_text()) == r


@pytest.mark.slow
def test_code_run_inside_the_signers_extent_finds_no_signer_but_did_under_the_python_sealer(tmp_path):
    """A signal handler, a gc callback and a finalizer that run inside the audit hook walk its frames
    for the signer: with the key in C (wharf_seal) they find none; with the fallback sealer in Python
    (the tools without the built module), the one every grading used before, they sign passes, and
    only the handler, seen for what it is (tamper), keeps the reward at 0."""
    attack = FIGHT_ATTACKS["interrupt_the_hook"] + "\n" + BUGGY
    r = _grade(tmp_path / "c", attack, timeout=FIGHT_TIMEOUT)
    assert (r["reward"], r["f2p_passed"], r["sealed"]) == (0.0, 0, 1), r
    tools = tmp_path / "python-sealer"
    shutil.copytree(TOOLS, tools, ignore=shutil.ignore_patterns("wharf_seal*.so", "__pycache__", "swegym"))
    r = _grade(tmp_path / "python", attack, timeout=FIGHT_TIMEOUT, tools=tools)
    assert (r["reward"], r["f2p_passed"], r["sealed"]) == (0.0, 1, 0), r
    problems = json.loads((tmp_path / "python" / "verifier" / "grading.json").read_text())["problems"]
    assert any("signal handler" in p or "interval timer" in p for p in problems), problems


@pytest.mark.slow
def test_a_test_process_that_closes_its_pipes_and_hangs_is_killed_at_the_timeout(tmp_path):
    # it shuts every descriptor (the records pipe and the output with them), then hangs: the grader
    # must not take the closed pipes for an exit
    payload = "import os, time\nos.closerange(0, 1024)\ntime.sleep(3600)\n"
    t0 = time.monotonic()
    r = _grade(tmp_path, payload + BUGGY, timeout=5)
    assert (r["reward"], r["timed_out"], r["session_finished"]) == (0.0, 1, 0), r
    assert time.monotonic() - t0 < 60


UNITTEST_TESTS = '''import unittest
from mathutil import sum_to


class SumTo(unittest.TestCase):
    def setUp(self):
        self.n = 3

    def test_sum_to(self):
        self.assertEqual(sum_to(self.n), 6)

    def test_zero(self):
        self.assertEqual(sum_to(0), 0)
'''


def test_unittest_testcases_are_graded_like_functions(tmp_path):
    """pytest binds a TestCase's test to a fresh instance at setup and drops it at teardown: no
    change since collection (it voided every honest run of such suites). The fix 1.0, the bug 0."""
    spec = json.loads((TASK / "tests" / "spec.json").read_text())
    spec.update(FAIL_TO_PASS=["test_ut.py::SumTo::test_sum_to"], PASS_TO_PASS=["test_ut.py::SumTo::test_zero"])
    got = {}
    for name, source in (("fix", BUGGY.replace("range(1, n)", "range(1, n + 1)")), ("bug", BUGGY)):
        work, tests, out = tmp_path / name / "app", tmp_path / name / "tests", tmp_path / name / "verifier"
        for d in (work, tests, out):
            d.mkdir(parents=True)
        (work / "mathutil.py").write_text(source)
        (tests / "test_ut.py").write_text(UNITTEST_TESTS)
        (tests / "spec.json").write_text(json.dumps(spec))
        env = {"PATH": os.defpath, "HOME": str(tmp_path), "WHARF_PYTHON": sys.executable, "WHARF_TESTS_DIR": str(tests),
               "WHARF_VERIFIER_DIR": str(out), "WHARF_TEST_TIMEOUT": "60", "OMP_WAIT_POLICY": "PASSIVE"}
        subprocess.run(["bash", str(TOOLS / "grade_pytest.sh"), str(work), "test_ut.py"], cwd=tmp_path, env=env,
                       capture_output=True, timeout=180)
        grading = json.loads((out / "grading.json").read_text())
        got[name] = (grading["reward"], grading.get("problems"))
    assert got == {"fix": (1.0, []), "bug": (0.0, [])}, got


# pytest_grade.py run with jail.py's fallback (no namespaces: a Docker verifier), as bench/grading.py's
# pytest-guard-bare runs it
UNCONFINED = ("import runpy, sys; sys.path.insert(0, {tools!r}); import jail; jail._PROBE['why'] = 'test'; "
              "sys.argv[0] = {tools!r} + '/pytest_grade.py'; runpy.run_path(sys.argv[0], run_name='__main__')")


def _judge(tmp: Path, python: str, mathutil: str | None = None,
           unconfined: bool = False) -> tuple[subprocess.CompletedProcess, Path]:
    """pytest_grade.py, the judge's own entry point as a made task's test.sh calls it: the tests run
    by `python` (a task's package env), the judge itself by this venv's."""
    work, tests, out = tmp / "app", tmp / "tests", tmp / "verifier"
    shutil.copytree(TASK / "environment", work)
    shutil.copytree(TASK / "tests", tests)
    if mathutil is not None:
        (work / "mathutil.py").write_text(mathutil)
    entry = ["-c", UNCONFINED.format(tools=str(TOOLS))] if unconfined else [str(TOOLS / "pytest_grade.py")]
    cmd = [sys.executable, "-I", *entry, "--spec", str(tests / "spec.json"), "--out", str(out),
           "--timeout", "60", "--python", python, "--workdir", str(work), "--tests-dir", str(tests),
           "--test-file", "test_task.py", "--", "-rA", "--noconftest", "-c", "/dev/null"]
    env = {"PATH": os.defpath, "HOME": str(tmp)}
    return subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=180), out


@pytest.mark.parametrize("env", ["no-pytest", "no-interpreter", "no-interpreter-unconfined"])
def test_a_test_env_that_cannot_start_pytest_is_a_verifier_error_not_a_zero(tmp_path, env):
    """The package env lacks pytest (a venv of the bare interpreter) or is not there at all (not
    bound into the sandbox): the tests never ran, so no reward.json (the trial is a verifier error,
    left out of training) and one line saying what did not start and where to look."""
    python = tmp_path / "env" / "bin" / "python"
    if env == "no-pytest":
        subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(tmp_path / "env")], check=True,
                       timeout=60)
    p, out = _judge(tmp_path, str(python), unconfined=env.endswith("unconfined"))
    assert p.returncode == 2, p.stdout + p.stderr
    assert not (out / "reward.json").exists()
    detail = json.loads((out / "grading.json").read_text())
    assert detail["verifier_error"] is True and detail["reward"] is None
    line = next(x for x in p.stdout.splitlines() if "verifier error" in x)
    assert "the tests never started" in line and str(python) in line and "test_output.log" in line
    assert {"no-pytest": "No module named 'pytest'", "no-interpreter": "No such file or directory",
            "no-interpreter-unconfined": "could not be started (FileNotFoundError"}[env] in line


@pytest.mark.parametrize("mathutil", ["raise ImportError('broken by the agent')\n",
                                      "import os, shutil\nshutil.rmtree(os.getcwd(), ignore_errors=True)\nos.kill(os.getpid(), 9)\n"])
def test_code_that_breaks_its_own_import_or_the_run_still_earns_0_not_a_verifier_error(tmp_path, mathutil):
    """The code under test runs only after pytest_report.py said READY: whatever it does to the
    run (exit at import, an import error, delete the tree and kill pytest) is a wrong answer."""
    p, out = _judge(tmp_path, sys.executable, mathutil)
    assert p.returncode == 0, p.stdout + p.stderr
    reward = json.loads((out / "reward.json").read_text())
    assert (reward["reward"], reward["resolved"], reward["f2p_passed"]) == (0.0, 0, 0), reward
    assert "verifier error" not in p.stdout and "verifier_error" not in (out / "grading.json").read_text()
