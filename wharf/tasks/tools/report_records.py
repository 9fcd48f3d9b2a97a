"""Verify the records pytest_report.py sent and turn them into a SWE-bench status map.

Standalone (stdlib only): pure functions, used by pytest_grade.py. A record is one line
`SEQ KIND FIELD_HEX... MAC_HEX`, MAC = HMAC-SHA256(key, "SEQ KIND FIELD_HEX...") (see
pytest_report.py). What makes a stream trustworthy, checked here:
  * every line verifies with this grading's key, and the SEQ numbers run 0, 1, 2, ... (nothing
    dropped, reordered or replayed);
  * the first record is `start` and the last is `finish` (the session ran to its end);
  * no `tamper` record (pytest's reporting machinery was the one loaded at start).
Anything else is a problem, and any problem means the records do not count (reward 0).
"""
from __future__ import annotations

import hashlib
import hmac

MAGIC = "wharf-report-1"  # the channel line pytest_report.py reads: MAGIC KEY_HEX FD
# pytest_report.py's first line on its stdout, written once pytest is imported and the sealer
# installed, before pytest.main: before any code of the workspace can run. Its absence is the
# environment's failure (no interpreter, no pytest, no report channel), never the code's.
READY = MAGIC + " ready"
KINDS = {"start": 2, "test": 4, "collect": 1, "tamper": 1, "finish": 1}  # kind -> number of fields
MAX_PROBLEMS = 20


def sign(key: bytes, body: str) -> str:
    return hmac.new(key, body.encode("ascii"), hashlib.sha256).hexdigest()


def _decode(fields: list[str]) -> list[str] | None:
    try:
        return ["" if f == "-" else bytes.fromhex(f).decode("utf-8") for f in fields]
    except (ValueError, UnicodeDecodeError):
        return None


def verify(data: bytes, key: bytes) -> dict:
    """The raw bytes read from the records descriptor -> {records: [(kind, fields)], problems,
    finished, exitstatus, tampered, sealer (what signed: c, python, or "" without a start)}."""
    records: list[tuple[str, list[str]]] = []
    problems: list[str] = []
    tampered: list[str] = []
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:
        problems.append("the last record is cut off (the test process died while writing)")
        lines.pop()
    for n, raw in enumerate(lines):
        why = _check_line(raw, key, len(records))
        if isinstance(why, str):
            problems.append(f"record {n}: {why}")
            continue
        kind, fields = why
        if records and records[-1][0] == "finish":
            problems.append(f"record {n}: {kind} after finish")
        if kind == "tamper":
            tampered.append(fields[0])
        records.append((kind, fields))
    if not records or records[0][0] != "start":
        problems.append("no start record: the report plugin never ran")
    finished = bool(records) and records[-1][0] == "finish"
    if not finished:
        problems.append("no finish record last: the test session did not run to its end")
    if tampered:
        problems.append(f"pytest's reporting was changed during the run: {tampered[:5]}")
    status = records[-1][1][0] if finished else ""
    return {"records": records, "problems": problems[:MAX_PROBLEMS], "finished": finished,
            "exitstatus": int(status) if status.lstrip("-").isdigit() else None, "tampered": tampered[:MAX_PROBLEMS],
            "sealer": records[0][1][1] if records and records[0][0] == "start" else ""}


def _check_line(raw: bytes, key: bytes, seq: int) -> tuple[str, list[str]] | str:
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return "not ASCII"
    parts = text.split(" ")
    if len(parts) < 3:
        return "too short"
    body, mac = " ".join(parts[:-1]), parts[-1]
    if not hmac.compare_digest(sign(key, body), mac):
        return "its MAC does not verify (not written by the report plugin)"
    if parts[0] != str(seq):
        return f"sequence number {parts[0]!r}, expected {seq}"
    kind, fields = parts[1], _decode(parts[2:-1])
    if kind not in KINDS or fields is None or len(fields) != KINDS[kind]:
        return f"malformed {kind!r} record"
    return kind, fields


def statuses(records: list[tuple[str, list[str]]]) -> dict[str, str]:
    """Per test id, the status SWE-bench's log parser would give it (PASSED, FAILED, ERROR,
    SKIPPED, XFAIL), from its phase reports. An XPASS, or a test without a finished call or a
    skip, gets no PASSED: it counts as failed, as a test missing from the log does."""
    phases: dict[str, dict[str, tuple[str, bool]]] = {}
    for kind, fields in records:
        if kind == "test":
            nodeid, when, outcome, xfail = fields
            phases.setdefault(nodeid, {})[when] = (outcome, xfail == "1")
    out = {}
    for nodeid, ph in phases.items():
        if any(o == "failed" for o, _ in ph.values()):
            out[nodeid] = "FAILED" if ph.get("call", ("",))[0] == "failed" else "ERROR"
        elif "call" in ph:
            outcome, xfail = ph["call"]
            out[nodeid] = {"passed": "FAILED" if xfail else "PASSED",
                           "skipped": "XFAIL" if xfail else "SKIPPED"}.get(outcome, "FAILED")
        elif ph.get("setup", ("",))[0] == "skipped":
            out[nodeid] = "XFAIL" if ph["setup"][1] else "SKIPPED"
    return out


def strict(status_map: dict[str, str]) -> dict[str, str]:
    """The status map as the reward reads it: only PASSED passes. An XFAIL, an XPASS or a SKIPPED
    test (pytest.xfail() or pytest.skip() called by the code under test) is a failure."""
    return {t: s if s == "PASSED" else "FAILED" for t, s in status_map.items()}


def disagreements(code: int | None, checked: dict, status_map: dict[str, str]) -> list[str]:
    """Where the process's exit code, the finish record's exit status and the statuses do not tell
    the same story (a signal handler that flips outcomes leaves one of them behind)."""
    status = checked["exitstatus"]
    if not checked["finished"]:
        return []  # already a problem: no finish record
    out = []
    if code != status:
        out.append(f"the test process exited with {code} but pytest's session finished with {status}")
    collect_failed = any(kind == "collect" for kind, _ in checked["records"])
    failed = collect_failed or any(s in ("FAILED", "ERROR") for s in status_map.values())
    if status not in (0, 1) or (status == 1) != failed:
        out.append(f"pytest's exit status {status} does not match the statuses recorded "
                   f"({'some' if failed else 'no'} test failed)")
    return out


def not_started(run: dict, python: str, log_path: str) -> str | None:
    """None when the test process got as far as READY; else the one line that says what did not
    start and where to look (a verifier error: no code of the workspace had run yet, so the
    failure is the environment's, not the code under test's)."""
    if run.get("ready"):
        return None
    if run.get("start_error"):
        what = f"the test interpreter {python!r} could not be started ({run['start_error']})"
    elif run.get("timed_out"):
        what = f"{python!r} did not get pytest loaded before the timeout"
    else:
        last = run.get("last_line") or "no output"
        what = f"{python!r} exited with code {run.get('code')} before pytest was loaded (last line: {last[:300]})"
    return (f"verifier error: the tests never started: {what}; nothing of the workspace had run. "
            f"Check that the interpreter exists inside the verifier's sandbox and has pytest "
            f"(the task's --python / WHARF_PYTHON, the env binds); output in {log_path}")


class NotStarted(Exception):
    """The test process never got pytest loaded: the judge could not judge (a verifier error)."""


def started(run: dict, python: str, log_path: str) -> dict:
    """`run`, when the test process said READY; else NotStarted with the reason."""
    why = not_started(run, python, log_path)
    if why is not None:
        raise NotStarted(why)
    return run
