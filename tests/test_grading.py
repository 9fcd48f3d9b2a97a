"""grading.py run as the sandboxes run it (`python grading.py ...`), on recorded SWE-bench logs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GRADING = ROOT / "wharf" / "tasks" / "tools" / "grading.py"
TESTLOG = ROOT / "wharf" / "tasks" / "tools" / "testlog.sh"
LOGS = ROOT / "datasets" / "fixtures" / "swegym" / "logs"
ROWS = ROOT / "datasets" / "fixtures" / "swegym" / "swegym_rows.jsonl"
ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}


def _row(iid: str) -> dict:
    rows = [json.loads(line) for line in ROWS.read_text().splitlines()]
    return next(r for r in rows if r["instance_id"] == iid)


def _spec(tmp_path: Path, iid="facebookresearch__hydra-90001", **over) -> Path:
    row = _row(iid)
    spec = {k: row[k] for k in ("instance_id", "repo", "version", "FAIL_TO_PASS", "PASS_TO_PASS")}
    spec.update(log_parser="parse_log_pytest", eval_type="pass_and_fail")
    spec.update(over)
    spec = {k: v for k, v in spec.items() if v is not None}
    p = tmp_path / "spec.json"
    p.write_text(json.dumps(spec))
    return p


def _grade(spec: Path, log: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GRADING), "--spec", str(spec), "--log", str(log),
                           "--out", str(out), *extra], capture_output=True, text=True, env=ENV, timeout=60)


def _reward(out: Path) -> dict:
    return json.loads((out / "reward.json").read_text())


def test_gold_log_grades_one_and_empty_patch_log_zero(tmp_path):
    spec = _spec(tmp_path)
    gold = _grade(spec, LOGS / "facebookresearch__hydra-90001.gold.log", tmp_path / "gold")
    assert gold.returncode == 0, gold.stderr
    assert _reward(tmp_path / "gold") == {
        "reward": 1.0, "resolved": 1, "log_ok": 1, "f2p_passed": 2, "f2p_total": 2,
        "p2p_passed": 2, "p2p_total": 2, "test_exit_code": 0, "grader_pytest_report": 0}
    empty = _grade(spec, LOGS / "facebookresearch__hydra-90001.empty.log", tmp_path / "empty")
    assert empty.returncode == 0, empty.stderr
    r = _reward(tmp_path / "empty")
    assert (r["reward"], r["resolved"], r["log_ok"], r["f2p_passed"], r["p2p_passed"]) == (0.0, 0, 1, 0, 2)
    detail = json.loads((tmp_path / "empty" / "grading.json").read_text())
    assert sorted(detail["FAIL_TO_PASS"]["failure"]) == sorted(_row("facebookresearch__hydra-90001")["FAIL_TO_PASS"])
    assert "reward 0.0" in empty.stdout


def test_every_value_in_reward_json_is_a_number(tmp_path):
    # harbor's verifier rejects any non-numeric value in reward.json.
    _grade(_spec(tmp_path), LOGS / "facebookresearch__hydra-90001.empty.log", tmp_path / "o")
    assert all(type(v) in (int, float) for v in _reward(tmp_path / "o").values())


def test_swebench_shaped_log_with_set_x_markers_and_json_string_lists(tmp_path):
    # The SWE-bench eval script prints its markers as `+ : '>>>>> Start Test Output'` traces,
    # and SWE-bench rows keep FAIL_TO_PASS as a JSON string.
    spec = _spec(tmp_path, iid="iterative__dvc-90002")
    raw = json.loads(spec.read_text())
    raw.update(instance_id="psf__requests-90003", FAIL_TO_PASS=json.dumps(["tests/test_ops.py::test_add_many"]),
               PASS_TO_PASS=json.dumps(raw["PASS_TO_PASS"]))
    spec.write_text(json.dumps(raw))
    assert _grade(spec, LOGS / "psf__requests-90003.gold.log", tmp_path / "g").returncode == 0
    assert _reward(tmp_path / "g")["reward"] == 1.0
    assert _grade(spec, LOGS / "psf__requests-90003.empty.log", tmp_path / "e").returncode == 0
    assert _reward(tmp_path / "e")["reward"] == 0.0


def test_printed_passed_lines_with_nonzero_exit_code_are_not_a_pass(tmp_path):
    log = tmp_path / "fake.log"
    text = (LOGS / "facebookresearch__hydra-90001.gold.log").read_text()
    log.write_text(text.replace(">>>>> Test Exit Code: 0", ">>>>> Test Exit Code: 1"))
    assert _grade(_spec(tmp_path), log, tmp_path / "o").returncode == 0
    r = _reward(tmp_path / "o")
    assert (r["reward"], r["log_ok"], r["test_exit_code"]) == (0.0, 0, 1)


def test_log_without_markers_grades_zero_and_says_why(tmp_path):
    log = tmp_path / "nomarkers.log"
    log.write_text("PASSED tests/test_ops.py::test_mean\nPASSED tests/test_ops.py::test_add\n")
    assert _grade(_spec(tmp_path, iid="iterative__dvc-90002"), log, tmp_path / "o").returncode == 0
    assert _reward(tmp_path / "o")["reward"] == 0.0
    assert "markers are missing" in json.loads((tmp_path / "o" / "grading.json").read_text())["not_gradable_reason"]


def test_patch_apply_failed_grades_zero(tmp_path):
    log = tmp_path / "apply.log"
    log.write_text(">>>>> Patch Apply Failed\n")
    assert _grade(_spec(tmp_path), log, tmp_path / "o").returncode == 0
    assert _reward(tmp_path / "o")["reward"] == 0.0
    assert "failed to apply" in json.loads((tmp_path / "o" / "grading.json").read_text())["not_gradable_reason"]


@pytest.mark.parametrize("over, words", [
    ({"FAIL_TO_PASS": None}, ["FAIL_TO_PASS", "missing"]),
    ({"FAIL_TO_PASS": "not json ["}, ["FAIL_TO_PASS", "not JSON"]),
    ({"log_parser": "parse_log_nope"}, ["unknown log_parser", "parse_log_pytest"]),
    ({"eval_type": "sometimes"}, ["eval_type", "pass_and_fail"]),
    ({"instance_id": ""}, ["instance_id"]),
])
def test_bad_spec_writes_no_reward_by_default(tmp_path, over, words):
    spec = _spec(tmp_path, **over)
    p = _grade(spec, LOGS / "facebookresearch__hydra-90001.gold.log", tmp_path / "o")
    assert p.returncode == 2
    assert not (tmp_path / "o" / "reward.json").exists()  # harbor: verifier error, not a 0.0
    err = json.loads((tmp_path / "o" / "grading.json").read_text())["error"]
    for w in words:
        assert w in err and w in p.stderr


def test_missing_log_is_a_grading_error_and_on_error_zero_writes_zero(tmp_path):
    spec = _spec(tmp_path)
    p = _grade(spec, tmp_path / "nope.log", tmp_path / "o")
    assert p.returncode == 2 and "nope.log not found" in p.stderr
    assert not (tmp_path / "o" / "reward.json").exists()
    p = _grade(spec, tmp_path / "nope.log", tmp_path / "z", "--on-error", "zero")
    assert p.returncode == 2
    assert _reward(tmp_path / "z") == {"reward": 0.0, "grading_error": 1}


def test_missing_spec_file_names_it(tmp_path):
    p = _grade(tmp_path / "absent.json", LOGS / "iterative__dvc-90002.gold.log", tmp_path / "o")
    assert p.returncode == 2 and "absent.json" in p.stderr


def _bash(script: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f". {TESTLOG}\n{script}"], cwd=cwd, capture_output=True,
                          text=True, timeout=60, env=ENV)


def test_testlog_records_markers_and_exit_code_even_under_set_e(tmp_path):
    p = _bash("set -e\nwharf_run_tests out/t.log 'echo hello; exit 3' || echo rc=$?\necho still-here", tmp_path)
    assert "rc=3" in p.stdout and "still-here" in p.stdout
    assert (tmp_path / "out" / "t.log").read_text() == (
        ">>>>> Start Test Output\nhello\n>>>>> End Test Output\n>>>>> Test Exit Code: 3\n")


def test_testlog_timeout_marks_the_log(tmp_path):
    p = _bash("WHARF_TEST_TIMEOUT=1 wharf_run_tests t.log 'sleep 20'; echo rc=$?", tmp_path)
    assert "rc=124" in p.stdout
    assert ">>>>> Tests Timed Out" in (tmp_path / "t.log").read_text()


def test_testlog_usage_error(tmp_path):
    p = _bash("wharf_run_tests only-a-log; echo rc=$?", tmp_path)
    assert "rc=2" in p.stdout and "usage" in p.stderr


@pytest.mark.parametrize("name, allowed", [
    ("grading.py", {"swebench"}), ("report_records.py", set()),
    ("pytest_report.py", {"pytest", "_pytest", "pytest_guard", "pytest_exact"}), ("pytest_exact.py", {"_pytest"}), ("pytest_guard.py", {"_pytest", "pluggy", "wharf_seal", "pytest_decide"}),
    ("pytest_decide.py", set()),
    ("pytest_grade.py", {"grading", "report_records", "judge_io", "jail", "pytest_tree"}),  # its siblings in wharf/tasks/tools
    ("pytest_tree.py", set()),
    # the checker and contest judges run under python -I -S: the stdlib and their siblings only
    ("judge.py", {"grading", "jail", "judge_calls", "judge_io", "judge_state"}), ("judge_calls.py", {"jail"}),
    ("judge_state.py", {"judge_calls"}), ("judge_io.py", set()), ("call_child.py", set()), ("jail.py", set()),
])
def test_the_grading_tools_import_only_stdlib_swebench_pytest_and_each_other(name, allowed):
    import ast

    tree = ast.parse((GRADING.parent / name).read_text())
    roots = {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    roots |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert roots - {"__future__"} - allowed <= set(sys.stdlib_module_names)
