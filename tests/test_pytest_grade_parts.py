"""The pytest judge's parts by hand (wharf/tasks/tools): the report plugin's signer, the sealers,
the record stream's checks, swebench's log statuses, the exact-equality rewrite, which test
functions count, and the reward proof. tests/test_pytest_grade.py runs the judge whole."""
from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "wharf" / "tasks" / "tools"


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
