"""Grading from pytest's own reports (wharf/tasks/tools/pytest_grade.py, pytest_report.py,
report_records.py): the record stream's checks by hand, then grade_pytest.sh run as a task's
test.sh runs it, outside a sandbox, on the honest fix and on attackers that forge the result
from inside the test process (the same ones tests/test_redteam.py runs in the sandbox)."""
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


def _load(name: str):
    """A standalone tool of wharf/tasks/tools, loaded from its file (they are not imported as a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"wharf_tool_{name}", TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report_records = _load("report_records")
_signer = _load("pytest_report")._signer

KEY = bytes(range(32))


def _line(seq: int, kind: str, *fields: str, key: bytes = KEY) -> bytes:
    body = f"{seq} {kind} " + " ".join(f.encode().hex() or "-" for f in fields)
    return f"{body} {hmac.new(key, body.encode(), hashlib.sha256).hexdigest()}\n".encode()


def _stream(*recs: tuple, key: bytes = KEY) -> bytes:
    return b"".join(_line(i, *r, key=key) for i, r in enumerate(recs))


GOOD = (("start", "7", "c"), ("test", "t.py::a", "setup", "passed", "0"), ("test", "t.py::a", "call", "passed", "0"),
        ("test", "t.py::a", "teardown", "passed", "0"), ("finish", "0"))


def test_the_plugins_signer_is_hmac_sha256():
    msg = b"3 test 74 63 61 30"
    assert _signer(KEY)(msg) == hmac.new(KEY, msg, hashlib.sha256).hexdigest()


def test_the_sealers_checks_look_up_no_name_at_call_time_and_it_watches_every_refused_event():
    """What runs inside the sealer's hook binds every name when defined (a replaced builtin or module
    attribute is never called from there), and the C hook hands decide every event it refuses."""
    import dis

    guard = _load("pytest_decide")
    for fn in guard.SEALED:
        looked_up = [i.argval for i in dis.get_instructions(fn) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")]
        assert looked_up == [], (fn.__name__, looked_up)
    seal = _sealer()
    assert set(seal.events()) >= guard.REFUSED | {"wharf.record", "open", "ctypes.dlsym", "object.__setattr__", "import"}
    sys.path.insert(0, str(TOOLS))  # the fallback sealer looks for tampering at the same events
    try:
        assert set(seal.events()) == _load("pytest_guard").WATCHED_EVENTS
    finally:
        sys.path.remove(str(TOOLS))


def _sealer():
    """wharf/tasks/tools/wharf_seal, built by make setup (build_seal.sh)."""
    import importlib.machinery
    import importlib.util
    import sysconfig

    path = TOOLS / f"wharf_seal{sysconfig.get_config_var('EXT_SUFFIX')}"
    assert path.exists(), f"{path}: not built; run make setup (wharf/tasks/tools/build_seal.sh)"
    spec = importlib.util.spec_from_file_location("wharf_seal", path, loader=importlib.machinery.ExtensionFileLoader(
        "wharf_seal", str(path)))
    return importlib.util.module_from_spec(spec)


SEALER_PROBE = """import os, sys
sys.path.insert(0, sys.argv[1])
import wharf_seal
r, w = os.pipe()
def decide(ctx, state, event, args, frame):
    if event == "wharf.record":
        return (("kept",), ("test", *args[1:], "\u00e9", ""), None)
    return (None, ("tamper", "refused: " + event), event) if event == "gc.get_objects" else None
wharf_seal.install(bytes(range(32)), w, decide, (), ())
try:
    wharf_seal.install(b"k" * 32, 1, decide, (), ())
except RuntimeError as e:
    print(e)
sys.audit("wharf.record", "test", "a.py::t", "call")
try:
    import gc; gc.get_objects()
except RuntimeError as e:
    print(e)
os.close(w)
sys.stdout.write(os.read(r, 4096).decode())
"""


def test_the_c_sealer_installs_once_and_signs_what_decide_answers_with_hmac_sha256():
    p = subprocess.run([sys.executable, "-I", "-c", SEALER_PROBE, str(TOOLS)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[:2] == ["wharf_seal: installed already", "wharf: gc.get_objects is refused while the tests are graded"]
    v = report_records.verify(("\n".join(lines[2:]) + "\n").encode(), KEY)
    assert v["records"] == [("test", ["a.py::t", "call", "\u00e9", ""]), ("tamper", ["refused: gc.get_objects"])], v
    assert v["problems"][0] == "no start record: the report plugin never ran"  # the MACs and sequence verify


def test_a_complete_verified_stream_has_no_problem():
    v = report_records.verify(_stream(*GOOD), KEY)
    assert (v["problems"], v["finished"], v["exitstatus"]) == ([], True, 0)
    assert report_records.statuses(v["records"]) == {"t.py::a": "PASSED"}


@pytest.mark.parametrize("data, words", [
    (_stream(*GOOD, key=b"k" * 32), "does not verify"),
    (_stream(*GOOD[:-1]), "did not run to its end"),
    (_stream(*GOOD)[:-5], "cut off"),
    (_stream(*GOOD[1:]), "no start record"),
    (_stream(*GOOD) + _line(5, "test", "t.py::b", "call", "passed", "0"), "after finish"),
    (_stream(*GOOD[:2]) + _line(3, *GOOD[2]) + _line(4, *GOOD[3]) + _line(5, *GOOD[4]), "expected 2"),
    (_stream(*GOOD[:2], ("tamper", "_pytest.python.Function.runtest"), *GOOD[2:]), "reporting was changed"),
    (_stream(*GOOD).replace(b"0 start", b"PASSED t.py::a\n0 start"), "record 0: too short"),
])
def test_a_stream_that_is_not_whole_and_genuine_has_a_problem(data, words):
    problems = report_records.verify(data, KEY)["problems"]
    assert any(words in p for p in problems), problems


def test_statuses_follow_swebench_log_semantics():
    recs = [("test", n, w, o, x) for n, w, o, x in [
        ("a", "setup", "passed", "0"), ("a", "call", "failed", "0"),
        ("b", "setup", "failed", "0"),
        ("c", "setup", "skipped", "0"),
        ("d", "setup", "passed", "0"), ("d", "call", "skipped", "1"),
        ("e", "setup", "passed", "0"), ("e", "call", "passed", "1"),  # XPASS: not a pass
        ("f", "setup", "passed", "0"), ("f", "call", "passed", "0"), ("f", "teardown", "failed", "0"),
        ("g", "setup", "passed", "0"),  # no call: the session died in it
    ]]
    assert report_records.statuses([(r[0], list(r[1:])) for r in recs]) == {
        "a": "FAILED", "b": "ERROR", "c": "SKIPPED", "d": "XFAIL", "e": "FAILED", "f": "ERROR"}


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


def _verifier_dir(tmp: Path, reward: bytes | None, proof: str | None) -> Path:
    d = tmp / "verifier"
    d.mkdir(parents=True)
    if reward is not None:
        (d / "reward.json").write_bytes(reward)
    if proof is not None:
        (d / "reward.json.mac").write_text(proof + "\n")
    (d / "reward.txt").write_text("1")
    return d


def test_reward_proof_keeps_a_reward_whose_mac_verifies_or_whose_grader_does_not_take_part(tmp_path):
    from wharf.collect.sandbox import rewardproof

    key, reward = b"ab" * 32, b'{"reward": 1.0}\n'
    good = _verifier_dir(tmp_path / "a", reward, hmac.new(key, reward, hashlib.sha256).hexdigest())
    assert rewardproof.enforce(good, key, key_left=None) is None
    assert (good / "reward.json").read_bytes() == reward
    legacy = _verifier_dir(tmp_path / "b", reward, None)  # the key file was left as written
    assert rewardproof.enforce(legacy, key, key_left=key + b"\n") is None
    assert (legacy / "reward.json").read_bytes() == reward


@pytest.mark.parametrize("reward, proof, key_left, words", [
    (b'{"reward": 1.0}', None, None, "no reward.json.mac"),  # planted, the grader killed
    (b'{"reward": 1.0}', hmac.new(b"x" * 64, b'{"reward": 1.0}', hashlib.sha256).hexdigest(), None, "does not verify"),
    (b'{"reward": 1.0}', None, b"a forged key file", "no reward.json.mac"),
    (None, None, None, "no reward.json"),
])
def test_reward_proof_turns_a_reward_the_grader_did_not_sign_into_0(tmp_path, reward, proof, key_left, words):
    from wharf.collect.sandbox import rewardproof

    d = _verifier_dir(tmp_path, reward, proof)
    assert words in rewardproof.enforce(d, b"ab" * 32, key_left=key_left)
    assert json.loads((d / "reward.json").read_text()) == {"reward": 0.0, "reward_rejected": 1}
    assert not (d / "reward.txt").exists() and words in (d / "reward_rejected.txt").read_text()


@pytest.mark.slow
def test_a_test_process_that_closes_its_pipes_and_hangs_is_killed_at_the_timeout(tmp_path):
    # it shuts every descriptor (the records pipe and the output with them), then hangs: the grader
    # must not take the closed pipes for an exit
    payload = "import os, time\nos.closerange(0, 1024)\ntime.sleep(3600)\n"
    t0 = time.monotonic()
    r = _grade(tmp_path, payload + BUGGY, timeout=5)
    assert (r["reward"], r["timed_out"], r["session_finished"]) == (0.0, 1, 0), r
    assert time.monotonic() - t0 < 60


def test_only_passed_passes_and_the_exit_code_must_tell_the_same_story():
    assert report_records.strict({"a": "PASSED", "b": "XFAIL", "c": "SKIPPED", "d": "FAILED"}) == {
        "a": "PASSED", "b": "FAILED", "c": "FAILED", "d": "FAILED"}
    finished = {"finished": True, "exitstatus": 0, "records": [("start", ["1", "c"]), ("finish", ["0"])]}
    assert report_records.disagreements(0, finished, {"a": "PASSED"}) == []
    # a handler flipped the outcome, then the timer's signal killed the process (bwrap: 128 + 14)
    assert "exited with 142" in report_records.disagreements(142, finished, {"a": "PASSED"})[0]
    failed = {**finished, "exitstatus": 1}
    assert "does not match" in report_records.disagreements(1, failed, {"a": "PASSED"})[0]
    assert report_records.disagreements(1, failed, {"a": "PASSED", "b": "FAILED"}) == []
    collect = {**failed, "exitstatus": 2, "records": finished["records"][:1] + [("collect", ["t.py"])]}
    assert report_records.disagreements(2, collect, {})  # interrupted: never resolved


def test_exact_eq_reads_builtin_values_and_refuses_an_object_equal_to_everything():
    from decimal import Decimal
    from fractions import Fraction

    exact = _load("pytest_exact").exact_eq

    class AlwaysInt(int):
        def __eq__(self, other):
            return True
        __hash__ = int.__hash__

    class Always:
        def __eq__(self, other):
            return True

    class Str(str):
        pass

    for fooled in [(AlwaysInt(0), 6), (6, AlwaysInt(0)), (Always(), 6), ([AlwaysInt(1)], [2]), ({"a": Always()}, {"a": 1}),
                   (Always(), "x"), ((1, 2), [1, 2])]:
        assert exact(*fooled) is False, fooled
    for honest in [(AlwaysInt(6), 6), (Fraction(4, 2), 2), (Decimal("1.5"), 1.5), (Str("x"), "x"), (True, 1),
                   ([1, (2, "a")], [1, (2, "a")]), ({"k": [1]}, {"k": [1]}), (Fraction(1, 2), Fraction(1, 2))]:
        assert exact(*honest), honest


def test_the_exact_rewrite_takes_the_equalities_an_assert_tests_and_nothing_else():
    import ast

    exact = _load("pytest_exact")
    source = ("assert f() == 6\nassert a == b == c\nassert (lambda: x == 1)()\nx = f() == 6\n"
              "assert (arr == [1, 2]).all()\nassert not (g() == 1 and h() == 2)\n")
    tree = ast.parse(source)
    exact._EqRewriter().visit(tree)
    text = ast.unparse(tree)
    assert text.count("_wharf_exact_eq") == 3, text  # f() == 6, g() == 1, h() == 2
    for kept in ("a == b == c", "x == 1", "x = f() == 6", "(arr == [1, 2]).all()"):
        assert kept in text


SEALER_POLL = """import os, shutil, signal, sys, tempfile
sys.path.insert(0, sys.argv[1])
import wharf_seal
r, w = os.pipe()
def decide(ctx, state, event, args, frame):
    if event == "import" and args[0] == "_wharf_refused":
        return (None, None, "import _wharf_refused")
    return (None, ("test", event, "", "", ""), None) if event == "wharf.record" else None
wharf_seal.install(bytes(range(32)), w, decide, (), (), (("/tmp/",), ()))
try:
    import _wharf_refused
except ImportError as e:
    print(type(e).__name__, e)
sys.audit("wharf.record")  # the session's start: the state to compare with
open(os.devnull).close()
if sys.argv[2] == "signal":
    signal.signal(signal.SIGUSR1, lambda *a: None)
    open(os.devnull).close()
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
elif sys.argv[2] == "timer":
    signal.setitimer(signal.ITIMER_VIRTUAL, 100.0)
else:  # a shared object copied to /tmp and loaded from there
    import importlib.util, _json
    d = tempfile.mkdtemp(dir="/tmp")
    so = shutil.copy(_json.__file__, d)
    spec = importlib.util.spec_from_file_location("_json", so)
    importlib.util.module_from_spec(spec)
    shutil.rmtree(d)
open(os.devnull).close()
open(os.devnull).close()
os.close(w)
sys.stdout.write(os.read(r, 65536).decode())
"""


@pytest.mark.parametrize("mode, why", [("signal", "a signal handler installed while the tests ran"),
                                       ("timer", "an interval timer armed while the tests ran"),
                                       ("native", "native code loaded: ctypes, cffi, or a shared object from a place")])
def test_the_c_sealer_records_what_no_audit_event_announces_once_and_refuses_imports_as_missing(mode, why):
    p = subprocess.run([sys.executable, "-I", "-c", SEALER_POLL, str(TOOLS), mode], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "ImportError wharf: import _wharf_refused is refused while the tests are graded"
    v = report_records.verify(("\n".join(lines[1:]) + "\n").encode(), KEY)
    tampered = [f[0] for kind, f in v["records"] if kind == "tamper"]
    assert len(tampered) == 1 and tampered[0].startswith(why), v["records"]  # once, not again


def test_a_test_function_counts_only_if_a_pristine_test_file_compiles_to_it_or_it_wraps_one():
    import functools

    decide = _load("pytest_decide")

    def test_x():
        pass

    @functools.wraps(test_x)
    def wrapper():
        return test_x()

    codes = frozenset({test_x.__code__})
    assert decide._test_function(test_x, codes)[3] and decide._test_function(wrapper, codes)[3]
    assert not decide._test_function(lambda: None, codes)[3]
    assert decide._test_function(lambda: None, frozenset())[3]  # no test file named: nothing to compare


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
