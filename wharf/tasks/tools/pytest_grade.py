"""Grade a pytest task from pytest's own reports, not from its printed output.

    python -I pytest_grade.py --spec SPEC.json --out DIR [--timeout S] [--python PY]
        [--workdir DIR] [--tests-dir DIR] [--test-file FILE]... [--only-spec] -- PYTEST_OPTIONS...

grade_pytest.sh runs it. Standalone: stdlib, swebench (through grading.py) and, in the test
process, pytest. In order:
  1. read the spec and the pristine test files (--tests-dir) into memory (the tests may rewrite
     the files), draw a per-grading key;
  2. copy the workspace afresh (pytest_tree.py) with the test files put in, and run
     `PY -I pytest_report.py PYTEST_ARGS` there with the key and the number of a records
     descriptor on its stdin (see pytest_report.py), its output teed into DIR/test_output.log
     between the SWE-bench markers, for people and for swebench's log report;
  3. the test process runs in namespaces of its own (jail.py): it cannot see or signal this
     process, nor write outside its copy of the workspace and its own /tmp, nor write the test
     files (bound read-only); when it exits (or at the timeout) its pid namespace ends, which
     kills every process it started, however it forked; if any were still alive, no reward 1.0;
  4. verify the records and grade them with swebench's rules (grading.grade_statuses), read
     strictly: only PASSED passes (an XFAIL, XPASS or SKIPPED spec test is a failure), and the
     process's exit code, the finish record's exit status and the statuses must agree;
  5. when resolved, run the same tests again in another fresh copy, a fresh process and a fresh
     key (recheck): every FAIL_TO_PASS and PASS_TO_PASS test must pass there too, or the reward
     is 0;
  6. write grading.json and reward.json last, over anything the tests wrote there; or, when a run
     never printed pytest_report.py's READY line (no interpreter, no pytest: the environment's
     fault, no code under test had run), no reward but verifier_error.txt (docs/judges.md).
Reward 1.0 needs: the records verify (key, sequence, start first, finish last), no tamper
record, the process exited by itself before the timeout with the code pytest finished with,
every spec test PASSED in both runs. The log's own verdict is kept beside it (log_reward) and
never decides. This process is not dumpable, so the tests cannot read its memory or environment.
Without --test-file (the tests named among pytest's options, as bench/grading.py does) the
workspace is copied as it is and there is no second run. With --only-spec, pytest is given the
spec's own node ids instead of the whole test files (the other tests of those files never decide
the reward, and a big file's can cost most of the run); tasks whose ids come from pytest itself
use it (wharf tasks make's).

reward.json (numbers only, as harbor requires): reward, resolved, log_ok, f2p_passed, f2p_total,
p2p_passed, p2p_total, test_exit_code, grader_pytest_report (1: this grader), records_ok,
session_finished, timed_out, log_reward (what the log alone would have given, -1 if not gradable),
recheck (1 the second run agreed, 0 it did not, -1 not run), confined (1: the tests ran in
namespaces of their own), sealed (1: the records were signed by the C sealer, wharf_seal.c; 0: by
the fallback in Python, where it is not built for the tests' interpreter).
"""
from __future__ import annotations

import argparse
import os
import random
import secrets
import selectors
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -I: our siblings
import grading  # noqa: E402
import jail  # noqa: E402
import judge_io  # noqa: E402
import pytest_tree  # noqa: E402
import report_records  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_RECORDS = 64 << 20  # bytes of records kept; more is an attack, not a test suite
MAX_HEAD = 64 << 10  # bytes of output searched for READY (pytest_report.py writes it first)


def _records_fd(w: int) -> int:
    """Move the write end of the records pipe to a random high descriptor number."""
    import resource

    top = min(1000, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 1)
    while True:
        n = random.SystemRandom().randrange(100, top)
        try:
            os.fstat(n)
        except OSError:
            os.dup2(w, n, inheritable=True)
            os.close(w)
            return n


def run_tests(python: str, options: list[str], key: bytes, log, timeout: float, tree: dict) -> dict:
    """Run the tests in namespaces of their own (jail.py), in a fresh merged copy of the workspace
    (pytest_tree.py: its test files read-only); tee their output into `log`; return {code,
    timed_out, records (bytes), survivors (why something they started may be alive), confined}."""
    copy = pytest_tree.merged_copy(tree["workdir"], tree["tests"])
    try:
        return _run_in(python, options, key, log, timeout, tree, copy)
    finally:
        pytest_tree.remove(copy)


def _run_in(python: str, options: list[str], key: bytes, log, timeout: float, tree: dict, copy: str) -> dict:
    r, w = os.pipe()
    fd = _records_fd(w)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env.update(PYTHONDONTWRITEBYTECODE="1")
    root = copy if jail.unavailable() else tree["workdir"]  # where the copy appears to the tests
    argv = [python, "-I", os.path.join(HERE, "pytest_report.py"), *options, "--rootdir", root, "-p", "no:cacheprovider",
            *(tree.get("select") or tree["tests"])]
    try:
        run = jail.start(argv, tree["workdir"], python, pass_fds=(fd,), source=copy, read_only=tuple(tree["tests"]),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    except OSError as e:  # no such interpreter (unconfined: bwrap itself reports it on the output)
        os.close(fd)
        os.close(r)
        return {"code": None, "timed_out": False, "records": b"", "survivors": None, "confined": False,
                "ready": False, "start_error": f"{type(e).__name__}: {e}"}
    proc, survivors = run.proc, None
    os.close(fd)
    try:
        proc.stdin.write(f"{report_records.MAGIC} {key.hex()} {fd}\n".encode())
        proc.stdin.close()
    except OSError:
        pass  # it died at once: no start record, graded as such
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(r, selectors.EVENT_READ, "rec")
    records, deadline, timed_out, reaped = bytearray(), time.monotonic() + timeout, False, False
    head = bytearray()  # the output's start, where pytest_report.py says READY
    while sel.get_map():
        if not reaped and (proc.poll() is not None or time.monotonic() > deadline):
            timed_out = proc.returncode is None
            survivors = jail.end(run)  # after this nothing holds the pipes: they reach EOF
            reaped = True
        for sk, _ in sel.select(timeout=0.2):
            chunk = os.read(sk.fd, 65536)
            if not chunk:
                sel.unregister(sk.fileobj)
            elif sk.data == "out":
                if len(head) < MAX_HEAD:
                    head += chunk[:MAX_HEAD]
                log.write(chunk)
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
            elif len(records) < MAX_RECORDS:
                records += chunk
    if not reaped:  # both pipes closed before it exited: it still has until the deadline
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        survivors = jail.end(run)
    os.close(r)
    proc.stdout.close()
    lines = bytes(head).decode("utf-8", "replace").splitlines()
    return {"code": proc.returncode, "timed_out": timed_out, "records": bytes(records), "survivors": survivors,
            "confined": run.confined, "ready": report_records.READY.encode() in head,
            "last_line": next((x.strip() for x in reversed(lines) if x.strip()), "")}


def run_problems(run: dict, checked: dict, status_map: dict[str, str]) -> list[str]:
    """Why a run's records cannot be trusted (empty: they can)."""
    problems = list(checked["problems"])
    if run["survivors"]:
        problems.insert(0, run["survivors"])
    if run["timed_out"]:
        problems.insert(0, "the tests did not exit before the timeout (killed)")
    elif run["code"] is not None and run["code"] < 0:
        problems.insert(0, f"the test process was killed by signal {-run['code']}")
    if not run["timed_out"]:
        problems += report_records.disagreements(run["code"], checked, status_map)
    return problems


def grade(spec: dict, run: dict, key: bytes, log_path: str) -> dict:
    """grading.json's dict: the verdict of the records, with the log's beside it."""
    checked = report_records.verify(run["records"], key)
    status_map = report_records.statuses(checked["records"])
    verdict = grading.grade_statuses(spec, report_records.strict(status_map))
    problems = run_problems(run, checked, status_map)
    ok = not problems and checked["finished"]
    try:
        log_view = grading.grade(spec, log_path)
        log_reward, log_ok = log_view["reward"], log_view["log_ok"]
    except Exception as e:  # noqa: BLE001 - the tests wrote the log: whatever it makes the parser raise
        log_reward, log_ok = None, False
        problems.append(f"the log could not be graded: {type(e).__name__}: {str(e)[:300]}")
    resolved = ok and verdict["resolved"]
    return {
        "instance_id": spec["instance_id"], "grader": "pytest-report",
        "reward": 1.0 if resolved else 0.0, "resolved": resolved, "records_ok": ok,
        "session_finished": checked["finished"], "timed_out": run["timed_out"],
        "test_exit_code": run["code"], "pytest_exitstatus": checked["exitstatus"],
        "log_ok": log_ok, "log_reward": log_reward, "problems": problems,
        "FAIL_TO_PASS": verdict["FAIL_TO_PASS"], "PASS_TO_PASS": verdict["PASS_TO_PASS"],
        "statuses": status_map, "log_path": os.path.abspath(log_path),
        "confinement": jail.unavailable() or jail.CONFINED, "sealer": checked["sealer"], "error": None,
    }


def recheck(args, spec: dict, result: dict, options: list[str], tree: dict) -> dict:
    """The same tests once more, in a fresh copy of the merged tree, a fresh interpreter and a
    fresh key: a resolved verdict stands only if every FAIL_TO_PASS and PASS_TO_PASS test passes
    there too, with records as whole (an attack must win twice, and the first run cannot prepare
    the second: it never sees the first run's tree). Sets result["recheck"]: 1 agreed, 0
    disagreed, -1 not run (not resolved, or no --test-file: the tests are named among pytest's options)."""
    result["recheck"] = -1
    if not result["resolved"] or not args.test_file:
        return result
    key = secrets.token_bytes(32)
    log_path = os.path.join(args.out, "recheck_output.log")
    with open(log_path, "wb") as log:
        run = report_records.started(run_tests(args.python, options, key, log, args.timeout, tree), args.python,
                                     log_path)
    checked = report_records.verify(run["records"], key)
    status = report_records.statuses(checked["records"])
    problems = run_problems(run, checked, status)
    verdict = grading.grade_statuses(spec, report_records.strict(status))
    agrees = not problems and checked["finished"] and verdict["resolved"]
    result["recheck"] = int(agrees)
    if not agrees:
        result.update(reward=0.0, resolved=False)
        result["problems"].append("the second run disagrees: "
                                  + "; ".join(problems[:3] or [str(status)[:300]]))
    return result


def spec_selection(spec: dict, test_files) -> list[str]:
    """--only-spec: the spec's FAIL_TO_PASS and PASS_TO_PASS node ids that lie in a pristine test
    file, once each, in the spec's order. An id outside them never runs, so it counts as failed;
    none left (an empty list would make pytest run the whole workspace): the files themselves."""
    files, out = set(test_files), []
    for nodeid in [*spec["FAIL_TO_PASS"], *spec["PASS_TO_PASS"]]:
        if nodeid.split("::", 1)[0] in files and nodeid not in out:
            out.append(nodeid)
    return out


def reward_numbers(result: dict) -> dict:
    n = grading.reward_numbers(result)
    n.update(grader_pytest_report=1, records_ok=int(result["records_ok"]),
             session_finished=int(result["session_finished"]), timed_out=int(result["timed_out"]),
             log_reward=-1.0 if result["log_reward"] is None else float(result["log_reward"]),
             recheck=int(result.get("recheck", -1)), confined=int(jail.unavailable() is None),
             sealed=int(result.get("sealer") == "c"))
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pytest_grade.py", description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True, help="JSON file: instance_id, repo, FAIL_TO_PASS, ...")
    ap.add_argument("--out", default="/logs/verifier", help="dir for test_output.log, reward.json, grading.json")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds the tests may run (then killed: reward 0)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that runs pytest")
    ap.add_argument("--reward-key", help="the sandbox's reward key file: read and deleted before the tests "
                    "run; reward.json.mac = HMAC-SHA256(key, reward.json) is written beside reward.json")
    ap.add_argument("--test-file", action="append", default=[],
                    help="a test file to run, relative to the workspace (repeatable; after the pytest options)")
    ap.add_argument("--workdir", default=".", help="the agent's workspace (copied afresh for each run; never "
                    "shown to the tests itself)")
    ap.add_argument("--tests-dir", help="where the pristine test files are (default: the workspace: the caller "
                    "put them there)")
    ap.add_argument("--only-spec", action="store_true", help="run only the spec's FAIL_TO_PASS and PASS_TO_PASS "
                    "tests of the test files (their exact pytest node ids), not every test the files hold")
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then pytest's arguments")
    args = ap.parse_args(argv)
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    judge_io.harden()
    os.makedirs(args.out, exist_ok=True)
    reward_path, detail_path = os.path.join(args.out, "reward.json"), os.path.join(args.out, "grading.json")
    try:
        spec = grading.load_spec(args.spec)  # before the tests run: they could rewrite the file
    except grading.GradingError as e:
        print(f"pytest_grade.py: error: {e}", file=sys.stderr)
        grading._write_json(detail_path, {"error": str(e), "reward": None})
        return 2
    workdir = os.path.abspath(args.workdir)
    try:  # now, before any test runs: the tests could rewrite them later
        tree = {"workdir": workdir, "tests": pytest_tree.read_tests(args.tests_dir or workdir, args.test_file)}
        if args.only_spec:
            tree["select"] = spec_selection(spec, tree["tests"])
    except pytest_tree.TreeError as e:
        print(f"pytest_grade.py: error: {e}", file=sys.stderr)
        grading._write_json(detail_path, {"error": str(e), "reward": None})
        return 2
    reward_key = judge_io.take_reward_key(args.reward_key)
    key = secrets.token_bytes(32)
    log_path = os.path.join(args.out, "test_output.log")
    try:
        with open(log_path, "wb") as log:
            log.write(f"{grading.START}\n".encode())
            run = run_tests(args.python, pytest_args, key, log, args.timeout, tree)
            code = -1 if run["code"] is None else run["code"]
            log.write(f"{grading.END}\n>>>>> Test Exit Code: {code}\n".encode())
            if run["timed_out"]:
                log.write(b">>>>> Tests Timed Out\n")
        run = report_records.started(run, args.python, log_path)  # else the environment's failure, not the code's
        result = recheck(args, spec, grade(spec, run, key, log_path), pytest_args, tree)
    except report_records.NotStarted as e:  # no reward: the trial is a verifier error
        print(f"pytest_grade.py: {spec['instance_id']}: {e}", flush=True)
        print(f"pytest_grade.py: {e}", file=sys.stderr)
        judge_io.write_error(args.out, str(e), {"error": str(e), "reward": None, "verifier_error": True}, reward_key)
        return 2
    except grading.GradingError as e:  # swebench missing: the judge's own fault, no reward
        why = f"verifier error: the judge could not grade: {e}"
        print(f"pytest_grade.py: {why}", file=sys.stderr)
        judge_io.write_error(args.out, why, {"error": str(e), "reward": None, "verifier_error": True}, reward_key)
        return 2
    except pytest_tree.TreeError as e:  # the agent's workspace cannot be copied (a file it made unreadable):
        print(f"pytest_grade.py: error: {e}", file=sys.stderr)  # no signed reward, so the sandbox's 0
        judge_io.remove(reward_path)
        grading._write_json(detail_path, {"error": str(e), "reward": None})
        return 2
    judge_io.write_verdict(args.out, reward_numbers(result), result, reward_key)
    n = reward_numbers(result)
    print(f"pytest_grade.py: {spec['instance_id']}: reward {n['reward']} from pytest's reports "
          f"(FAIL_TO_PASS {n['f2p_passed']}/{n['f2p_total']}, PASS_TO_PASS {n['p2p_passed']}/{n['p2p_total']})"
          + "".join(f"; {p}" for p in result["problems"][:3]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
