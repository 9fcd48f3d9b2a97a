"""Call the code under test from a grader: a fresh interpreter per batch of calls (call_child.py)
in namespaces of its own (jail.py), the inputs over a pipe, plain JSON answers back, a timeout,
and every process it started killed afterwards. Standalone, stdlib only; the grader's side of the boundary."""
from __future__ import annotations

import json
import os
import subprocess

import jail

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_ANSWER = 16 << 20  # bytes; more is not an answer


def run_batch(python: str, workdir: str, calls: list[tuple], timeout: float) -> dict:
    """{answers: [{value} | {error}] one per call, timed_out, survivors (why something it started
    may still be alive, or None), confined, code, stderr (its tail)}."""
    request = json.dumps({"calls": [list(c) for c in calls]}).encode()
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": "/tmp", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    run = jail.start([python, "-I", os.path.join(HERE, "call_child.py"), workdir], workdir, python, env=env,
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    timed_out = False
    try:
        out, err = run.proc.communicate(request, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out, out, err = True, b"", b""
    finally:
        survivors = jail.end(run)  # nothing it started outlives the batch
        for pipe in (run.proc.stdin, run.proc.stdout, run.proc.stderr):
            pipe.close()
    return {"answers": decode(out[:MAX_ANSWER], len(calls)), "timed_out": timed_out, "survivors": survivors,
            "confined": run.confined, "code": run.proc.returncode, "stderr": err[-2000:].decode("utf-8", "replace")}


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
