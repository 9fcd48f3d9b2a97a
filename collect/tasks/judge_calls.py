"""Call the code under test from a grader: a fresh interpreter per batch of calls (call_child.py),
the inputs over a pipe, plain JSON answers back, a timeout, and every process it started killed
afterwards. Standalone, stdlib only; the grader's side of the boundary."""
from __future__ import annotations

import json
import os
import subprocess

import judge_io

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_ANSWER = 16 << 20  # bytes; more is not an answer


def run_batch(python: str, workdir: str, calls: list[tuple], timeout: float) -> dict:
    """{answers: [{value} | {error}] one per call, timed_out, code, stderr (its tail)}."""
    request = json.dumps({"calls": [list(c) for c in calls]}).encode()
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen([python, "-I", os.path.join(HERE, "call_child.py"), workdir], cwd=workdir, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(request, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out, out, err = True, b"", b""
    finally:
        judge_io.kill_all(proc)  # nothing it started outlives the batch
    return {"answers": decode(out[:MAX_ANSWER], len(calls)), "timed_out": timed_out, "code": proc.returncode,
            "stderr": err[-2000:].decode("utf-8", "replace")}


def decode(raw: bytes, n: int) -> list[dict]:
    """The child's answers, or an error for each call when they are not a list of n answers."""
    try:
        answers = json.loads(raw)
    except (ValueError, RecursionError):
        answers = None
    if not (isinstance(answers, list) and len(answers) == n
            and all(isinstance(a, dict) and len(a) == 1 and ("value" in a or "error" in a) for a in answers)):
        return [{"error": "no answer (the process died, hung, or sent something else)"}] * n
    return answers
