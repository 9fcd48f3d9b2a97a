"""The only process of a checker or contest grading that runs the code under test.

    python -I call_child.py WORKDIR      (started by judge_calls.py, never by hand)

Stdin: one JSON object {"calls": [[MODULE, NAME, ARGS], ...]} (ARGS a list, or null to read the
attribute instead of calling it). Stdout: one JSON list, an answer per call, {"value": V} or
{"error": "Type: message"}. Everything the code under test prints goes to stderr, so a print in
an honest solution does not spoil the answers. Standalone, stdlib only.

This process knows the inputs and nothing else: the expected answers stay in the grader, which
compares them with what comes back here. Whatever it sends is data (JSON), never an object.
"""
import importlib
import json
import os
import sys


def _answer(module, name, args):
    try:
        value = getattr(importlib.import_module(module), name)
        if args is not None:
            value = value(*args)
        json.dumps(value, allow_nan=False)  # only plain data goes back
        return {"value": value}
    except BaseException as e:  # noqa: BLE001 - SystemExit from the code under test is an answer too
        return {"error": "%s: %s" % (type(e).__name__, str(e)[:500])}


def main():
    out = os.dup(1)
    os.dup2(2, 1)  # the code under test prints to stderr
    request = json.loads(sys.stdin.read())
    workdir = sys.argv[1]
    os.chdir(workdir)
    sys.path.insert(0, workdir)
    answers = [_answer(m, n, a) for m, n, a in request["calls"]]
    data = json.dumps(answers).encode()
    while data:
        data = data[os.write(out, data):]


if __name__ == "__main__":
    main()
