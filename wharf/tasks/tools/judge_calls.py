"""Call the code under test from a grader: a fresh interpreter per batch of calls (call_child.py)
in namespaces of its own (jail.py), the inputs over a pipe, plain JSON answers back, a timeout,
and every process it started killed afterwards. Standalone, stdlib only; the grader's side of the boundary."""
from __future__ import annotations

import json
import os
import selectors
import subprocess
import time

import jail

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_ANSWER = 16 << 20  # bytes; more is not an answer
MAX_STDERR = 2000  # bytes of the child's stderr kept for grading.json


def run_batch(python: str, workdir: str, calls: list[tuple], timeout: float) -> dict:
    """{answers: [{value} | {error}] one per call, timed_out, survivors (why something it started
    may still be alive, or None), confined, code, stderr (its tail)}."""
    request = json.dumps({"calls": [list(c) for c in calls]}).encode()
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": "/tmp", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    run = jail.start([python, "-I", os.path.join(HERE, "call_child.py"), workdir], workdir, python, env=env,
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err, timed_out = exchange(run.proc, request, timeout)
    finally:
        survivors = jail.end(run)  # nothing it started outlives the batch
        for pipe in (run.proc.stdin, run.proc.stdout, run.proc.stderr):
            pipe.close()
    return {"answers": decode(out[:MAX_ANSWER], len(calls)), "timed_out": timed_out, "survivors": survivors,
            "confined": run.confined, "code": run.proc.returncode, "stderr": err.decode("utf-8", "replace")}


def exchange(proc: subprocess.Popen, request: bytes, timeout: float) -> tuple[bytes, bytes, bool]:
    """communicate() with bounds: the request in, at most MAX_ANSWER bytes of stdout and the last
    MAX_STDERR of stderr kept (a child that prints gigabytes costs the grader no memory), until
    both close or the timeout. Returns (stdout, stderr tail, timed_out)."""
    out, err, todo, deadline = bytearray(), bytearray(), memoryview(request), time.monotonic() + timeout
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    os.set_blocking(proc.stdin.fileno(), False)
    sel.register(proc.stdin, selectors.EVENT_WRITE, None)
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(out), bytes(err), True
        for key, _ in sel.select(timeout=min(left, 1.0)):
            if key.data is None:  # the request, as the child takes it
                try:
                    todo = todo[os.write(key.fd, todo):]
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    todo = todo[:0]  # it died or closed its stdin: its answers say so
                if not todo:
                    sel.unregister(proc.stdin)
                    proc.stdin.close()
                continue
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fileobj)
            elif key.data is out:
                out += chunk[:MAX_ANSWER + 1 - len(out)]
            else:
                err += chunk
                del err[:-MAX_STDERR]
    return bytes(out), bytes(err), False


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
