"""pytest_grade.py --only-spec: pytest is given the spec's node ids, not the whole test files
(what `wharf tasks make`'s test.sh asks for). The other tests of a file never run, an id in no
pristine test file never runs and counts as failed, and the verdicts are the whole-file ones."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "wharf" / "tasks" / "tools"
sys.path.insert(0, str(TOOLS))
import pytest_grade  # noqa: E402  (a standalone tool, imported from its dir as the judge does)

sys.path.remove(str(TOOLS))

FIXED = "def sum_to(n):\n    return sum(range(1, n + 1))\n"
BUGGY = "def sum_to(n):\n    return sum(range(1, n))\n"
# test_other is in no spec: it runs only when the whole file does
TESTS = """from mathutil import sum_to

def test_sum_to():
    assert sum_to(3) == 6

class TestMore:
    def test_zero(self):
        assert sum_to(0) == 0

    def test_other(self):
        assert False
"""
SPEC = {"instance_id": "only-spec", "repo": "wharf/only-spec", "version": "1",
        "FAIL_TO_PASS": ["tests/test_sum.py::test_sum_to"], "PASS_TO_PASS": ["tests/test_sum.py::TestMore::test_zero"],
        "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"}


def test_the_selection_is_the_spec_ids_in_pristine_files_once_each_in_order():
    spec = {"FAIL_TO_PASS": ["t/a.py::x", "t/b.py::C::y[1-2]", "other.py::z"],
            "PASS_TO_PASS": ["t/a.py::x", "t/a.py::w"]}
    assert pytest_grade.spec_selection(spec, ["t/a.py", "t/b.py"]) == ["t/a.py::x", "t/b.py::C::y[1-2]", "t/a.py::w"]
    assert pytest_grade.spec_selection(spec, ["t/c.py"]) == []  # then the files run, and the spec's tests fail


def _judge(tmp: Path, source: str, spec: dict, only_spec: bool = True) -> tuple[dict, dict]:
    work, tests, out = tmp / "app", tmp / "tests_pristine", tmp / "verifier"
    for d in (work, tests / "tests", out):
        d.mkdir(parents=True, exist_ok=True)
    (work / "mathutil.py").write_text(source)
    (tests / "tests" / "test_sum.py").write_text(TESTS)
    (tests / "spec.json").write_text(json.dumps(spec))
    cmd = [sys.executable, "-I", str(TOOLS / "pytest_grade.py"), "--spec", str(tests / "spec.json"), "--out", str(out),
           "--timeout", "20", "--workdir", str(work), "--tests-dir", str(tests), "--test-file", "tests/test_sum.py",
           *(["--only-spec"] if only_spec else []), "--", "-rA", "--noconftest", "-c", "/dev/null", "-o",
           f"pythonpath={work}", "--rootdir", str(work)]
    p = subprocess.run(cmd, cwd=work, env={"PATH": os.defpath, "HOME": str(tmp)}, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads((out / "reward.json").read_text()), json.loads((out / "grading.json").read_text())


@pytest.mark.parametrize("source, reward", [(FIXED, 1.0), (BUGGY, 0.0)], ids=["fix", "bug"])
def test_only_the_spec_tests_run_and_decide(tmp_path, source, reward):
    got, grading = _judge(tmp_path, source, SPEC)
    assert (got["reward"], got["records_ok"], got["timed_out"]) == (reward, 1, 0), grading
    assert sorted(grading["statuses"]) == sorted(SPEC["FAIL_TO_PASS"] + SPEC["PASS_TO_PASS"])  # not test_other
    if reward:
        assert got["recheck"] == 1  # the second run took the same selection


def test_without_it_the_whole_file_runs(tmp_path):
    """The contrast: every test of the file runs; the one in no spec fails and does not decide."""
    got, grading = _judge(tmp_path, FIXED, SPEC, only_spec=False)
    assert grading["statuses"]["tests/test_sum.py::TestMore::test_other"] == "FAILED"
    assert got["reward"] == 1.0, grading


def test_a_spec_id_in_no_pristine_test_file_never_runs_and_fails(tmp_path):
    spec = {**SPEC, "FAIL_TO_PASS": [*SPEC["FAIL_TO_PASS"], "tests/planted.py::test_sum_to"]}
    (tmp_path / "app" / "tests").mkdir(parents=True)
    (tmp_path / "app" / "tests" / "planted.py").write_text("def test_sum_to():\n    pass\n")  # the agent's file
    got, grading = _judge(tmp_path, FIXED, spec)
    assert (got["reward"], got["f2p_passed"], got["f2p_total"]) == (0.0, 1, 2), grading
