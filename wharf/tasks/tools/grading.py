"""Grade a SWE-bench-style test log into harbor's reward file.

Standalone on purpose: it imports only the stdlib and swebench 5.x (pinned: 5.0.2), because it
is copied into task dirs (tests/grading.py) and run inside sandboxes and containers:

    python grading.py --spec SPEC.json --log TEST_LOG [--out DIR] [--on-error skip|zero]

SPEC.json (one object):
    instance_id    str, required
    repo           str, required ("owner/name")
    version        str, optional (informational; "" if absent)
    FAIL_TO_PASS   list of test ids, or a JSON string of one (SWE-bench's form), required
    PASS_TO_PASS   same, optional (empty if absent)
    log_parser     a name in swebench's PARSER_REGISTRY, e.g. parse_log_pytest, required
    eval_type      "pass_and_fail" (default) or "fail_only"

TEST_LOG holds the test output between the SWE-bench markers `>>>>> Start Test Output` and
`>>>>> End Test Output`, followed by `>>>>> Test Exit Code: N`. Produce it with testlog.sh
(next to this file): `. testlog.sh; wharf_run_tests LOG 'pytest -rA tests/x.py'`.

Writes into DIR (default /logs/verifier):
    reward.json   flat numbers only, since harbor rejects any non-numeric value:
                  reward (1.0 resolved, else 0.0), resolved (0|1), log_ok (0|1: markers found,
                  patch applied, tests ran), f2p_passed, f2p_total, p2p_passed, p2p_total,
                  test_exit_code (-1 when not recorded), grader_pytest_report (0: graded
                  from the log; pytest_grade.py, which grades from pytest's reports, writes 1)
    grading.json  the whole story: per-test outcome, why a log was not gradable, any error.

Two kinds of failure, kept apart so that training never learns from our own bugs:
  * The log exists but is not gradable (no markers, test patch failed to apply, tests never
    ran, exit code contradicts the output): reward 0.0, exactly as SWE-bench scores it. An
    agent can cause this by breaking the repo, so it is a real outcome. Exit status 0.
  * The grader cannot grade at all (spec missing or invalid, log file missing, swebench not
    importable): an infrastructure fault. With --on-error skip (default) NO reward.json is
    written, so harbor records a verifier error (RewardFileNotFoundError) and the rollout is
    kept out of training; grading.json carries "error". --on-error zero writes reward 0.0
    with grading_error 1 instead. Exit status 2 either way, and the error goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

SWEBENCH_PIN = "5.0.2"
START = ">>>>> Start Test Output"
END = ">>>>> End Test Output"
EXIT_CODE_RE = re.compile(r">>>>> Test Exit Code:\s*(-?\d+)")
# The markers SWE-bench treats as "not gradable" (swebench.harness.constants).
BAD_MARKERS = {
    ">>>>> Patch Apply Failed": "the test patch failed to apply",
    ">>>>> Reset Failed": "resetting the repo failed",
    ">>>>> Tests Errored": "the test run errored",
    ">>>>> Tests Timed Out": "the tests timed out",
}
EVAL_TYPES = ("pass_and_fail", "fail_only")


class GradingError(Exception):
    """The grader could not grade (bad spec, missing log): not the agent's doing."""


def _test_list(spec: dict, key: str, where: str, required: bool) -> list[str]:
    if key not in spec:
        if required:
            raise GradingError(f"{where}: missing field {key!r} (a list of test ids)")
        return []
    value = spec[key]
    if isinstance(value, str):  # SWE-bench stores the lists as JSON strings
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise GradingError(f"{where}: field {key!r} is a string but not JSON ({e})") from e
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise GradingError(f"{where}: field {key!r} must be a list of strings, got {value!r:.200}")
    return value


def check_spec(spec: object, where: str = "spec") -> dict:
    """Validate a spec dict and return it normalised (lists parsed, defaults filled)."""
    if not isinstance(spec, dict):
        raise GradingError(f"{where}: must be a JSON object, got {type(spec).__name__}")
    out = {}
    for key in ("instance_id", "repo", "log_parser"):
        value = spec.get(key)
        if not isinstance(value, str) or not value:
            raise GradingError(f"{where}: field {key!r} must be a non-empty string, got {value!r}")
        out[key] = value
    out["version"] = str(spec.get("version") or "")
    out["eval_type"] = spec.get("eval_type") or "pass_and_fail"
    if out["eval_type"] not in EVAL_TYPES:
        raise GradingError(f"{where}: field 'eval_type' must be one of {EVAL_TYPES}, got {out['eval_type']!r}")
    out["FAIL_TO_PASS"] = _test_list(spec, "FAIL_TO_PASS", where, required=True)
    out["PASS_TO_PASS"] = _test_list(spec, "PASS_TO_PASS", where, required=False)
    if not out["FAIL_TO_PASS"] and not out["PASS_TO_PASS"]:
        # Nothing to check would grade every log as resolved.
        raise GradingError(f"{where}: FAIL_TO_PASS and PASS_TO_PASS are both empty; nothing to grade")
    return out


def load_spec(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError as e:
        raise GradingError(f"spec file {path} not found") from e
    except json.JSONDecodeError as e:
        raise GradingError(f"spec file {path} is not valid JSON: {e}") from e
    return check_spec(raw, where=f"spec file {path}")


def _why_not_gradable(content: str) -> str:
    for marker, why in BAD_MARKERS.items():
        if marker in content:
            return why
    if START not in content or END not in content:
        return "the test-output markers are missing (the tests did not run to the end)"
    return "no test results in the log, or the exit code contradicts them"


def grade(spec: dict, log_path: str) -> dict:
    """Grade one log with swebench's get_eval_report. Returns the grading.json dict.

    Raises GradingError when it cannot grade (see the module docstring)."""
    spec = check_spec(spec)
    if not os.path.isfile(log_path):
        raise GradingError(f"test log {log_path} not found (did test.sh run the tests?)")
    try:
        from swebench.harness.grading import get_eval_report
        from swebench.harness.log_parsers import PARSER_REGISTRY
        from swebench.types import TestSpec
    except ImportError as e:
        raise GradingError(f"cannot import swebench ({e}); pip install swebench=={SWEBENCH_PIN}") from e
    if spec["log_parser"] not in PARSER_REGISTRY:
        names = ", ".join(sorted(PARSER_REGISTRY))
        raise GradingError(f"spec: unknown log_parser {spec['log_parser']!r}; known: {names}")

    test_spec = TestSpec(
        instance_id=spec["instance_id"], image="", eval_script_list=[], repo=spec["repo"],
        version=spec["version"], FAIL_TO_PASS=spec["FAIL_TO_PASS"],
        PASS_TO_PASS=spec["PASS_TO_PASS"], log_parser=spec["log_parser"],
        eval_type=spec["eval_type"],
    )
    # model_patch only has to be non-None: the patch is already in the repo that was tested.
    prediction = {"instance_id": spec["instance_id"], "model_patch": "", "model_name_or_path": "agent"}
    report = get_eval_report(test_spec, prediction, log_path, include_tests_status=True)
    entry = report[spec["instance_id"]]

    with open(log_path, encoding="utf-8", errors="replace") as f:
        content = f.read()
    m = EXIT_CODE_RE.search(content)
    log_ok = bool(entry.get("patch_successfully_applied"))
    status = entry.get("tests_status") or {}
    f2p = status.get("FAIL_TO_PASS", {"success": [], "failure": spec["FAIL_TO_PASS"]})
    p2p = status.get("PASS_TO_PASS", {"success": [], "failure": spec["PASS_TO_PASS"]})
    resolved = bool(entry.get("resolved"))
    return {
        "instance_id": spec["instance_id"],
        "reward": 1.0 if resolved else 0.0,
        "resolved": resolved,
        "log_ok": log_ok,
        "not_gradable_reason": None if log_ok else _why_not_gradable(content),
        "test_exit_code": int(m.group(1)) if m else None,
        "FAIL_TO_PASS": {"success": f2p["success"], "failure": f2p["failure"]},
        "PASS_TO_PASS": {"success": p2p["success"], "failure": p2p["failure"]},
        "infra_failure_reason": entry.get("infra_failure_reason"),
        "log_path": os.path.abspath(log_path),
        "error": None,
    }


def grade_statuses(spec: dict, status_map: dict[str, str]) -> dict:
    """FAIL_TO_PASS / PASS_TO_PASS outcomes and resolution from a status map {test id: PASSED |
    FAILED | ERROR | SKIPPED | XFAIL} (pytest_grade.py's, from verified report records), by
    swebench's own rules. A spec test with no status is a failure whatever the eval_type."""
    spec = check_spec(spec)
    try:
        from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, EvalType, ResolvedStatus
        from swebench.harness.grading import get_eval_tests_report, get_resolution_status
    except ImportError as e:
        raise GradingError(f"cannot import swebench ({e}); pip install swebench=={SWEBENCH_PIN}") from e
    gold = {FAIL_TO_PASS: spec["FAIL_TO_PASS"], PASS_TO_PASS: spec["PASS_TO_PASS"]}
    report = get_eval_tests_report(status_map, gold, eval_type=EvalType(spec["eval_type"]))
    out = {}
    for key in (FAIL_TO_PASS, PASS_TO_PASS):
        success = [t for t in report[key]["success"] if t in status_map or _prefix_match(t, status_map)]
        out[key] = {"success": success, "failure": [t for t in gold[key] if t not in success]}
    resolved = (get_resolution_status(out) == ResolvedStatus.FULL.value
                and len(out[FAIL_TO_PASS]["success"]) == len(gold[FAIL_TO_PASS])
                and len(out[PASS_TO_PASS]["success"]) == len(gold[PASS_TO_PASS]))
    return {"FAIL_TO_PASS": out[FAIL_TO_PASS], "PASS_TO_PASS": out[PASS_TO_PASS], "resolved": resolved}


def _prefix_match(test: str, status_map: dict[str, str]) -> bool:
    # swebench matches ids truncated mid-parameter by prefix (its _resolve_case)
    return test.count("[") > test.count("]") and any(k.startswith(test) for k in status_map)


def reward_numbers(result: dict) -> dict:
    """The flat, numbers-only reward.json harbor accepts."""
    f2p, p2p = result["FAIL_TO_PASS"], result["PASS_TO_PASS"]
    code = result["test_exit_code"]
    return {
        "reward": float(result["reward"]),
        "resolved": int(result["resolved"]),
        "log_ok": int(result["log_ok"]),
        "f2p_passed": len(f2p["success"]),
        "f2p_total": len(f2p["success"]) + len(f2p["failure"]),
        "p2p_passed": len(p2p["success"]),
        "p2p_total": len(p2p["success"]) + len(p2p["failure"]),
        "test_exit_code": -1 if code is None else int(code),
        "grader_pytest_report": 0,  # 0: this reward is the log's verdict (pytest_grade.py writes 1)
    }


def _write_json(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)  # a reader never sees half a reward file


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="grading.py",
        description="Grade a SWE-bench-style test log into reward.json (see the module docstring).",
    )
    ap.add_argument("--spec", required=True, help="JSON file: instance_id, repo, FAIL_TO_PASS, ...")
    ap.add_argument("--log", required=True, help="test log with the SWE-bench markers")
    ap.add_argument("--out", default="/logs/verifier", help="dir for reward.json and grading.json")
    ap.add_argument("--on-error", choices=("skip", "zero"), default="skip",
                    help="when grading is impossible: skip = no reward.json (harbor: verifier "
                    "error), zero = reward 0.0 with grading_error 1")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    try:
        result = grade(load_spec(args.spec), args.log)
    except GradingError as e:
        print(f"grading.py: error: {e}", file=sys.stderr)
        _write_json(os.path.join(args.out, "grading.json"), {"error": str(e), "reward": None})
        if args.on_error == "zero":
            _write_json(os.path.join(args.out, "reward.json"), {"reward": 0.0, "grading_error": 1})
        return 2
    _write_json(os.path.join(args.out, "grading.json"), result)
    _write_json(os.path.join(args.out, "reward.json"), reward_numbers(result))
    n = reward_numbers(result)
    print(f"grading.py: {result['instance_id']}: reward {n['reward']} "
          f"(FAIL_TO_PASS {n['f2p_passed']}/{n['f2p_total']}, PASS_TO_PASS {n['p2p_passed']}/{n['p2p_total']}"
          + ("" if result["log_ok"] else f"; not gradable: {result['not_gradable_reason']}") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
