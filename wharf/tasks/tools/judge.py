"""Grade a task from outside the code under test: the checker and contest judges.

    python -I -S judge.py checker|contest --tests DIR --workdir W [--out DIR] [--timeout S]
        [--python PY] [--reward-key FILE] [--hide-spec]

Run by judge.sh from a task's tests/test.sh, with its cwd outside the workspace. Standalone:
stdlib and its siblings only, so `-I -S` (no site dir, no cwd, no PYTHON* variables) works, and
the workspace is never on sys.path. In order:
  1. read spec.json (FAIL_TO_PASS / PASS_TO_PASS: the checks that decide) and the task's judge
     file (tests/check.py or tests/contest.py) into memory, take the sandbox's reward key;
     with --hide-spec (the sandbox's /tests, a copy) remove them all from disk, before any code
     under test runs, so it can read neither the reference nor the checks;
  2. checker: call each named check `fn(state)` of check.py in this process with a read-only
     view of the workspace (judge_state.State); a check passes unless it raises;
     contest: per named check of contest.py's CHECKS, draw its inputs here from a fresh random
     seed, have the code under test answer them in one fresh interpreter (judge_calls.py: a
     pipe in, JSON out, a timeout), and compare with the reference computed here;
  3. write grading.json, reward.json and its MAC (judge_io.write_verdict) last.

contest.py: MODULE (the module under test, imported from the workspace by the child) and
CHECKS = {name: {"inputs": rng -> [args tuple, ...], "reference": f(*args) -> value,
optional "module", "function" (default: name), "same": (got, want) -> bool}}.

reward.json: reward (1.0 when every named check passed), resolved, log_ok (1: the judge ran),
f2p_passed, f2p_total, p2p_passed, p2p_total, timed_out, and judge_checker or judge_contest = 1.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import secrets
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I: our siblings, never the workspace
import grading  # noqa: E402
import jail  # noqa: E402
import judge_calls  # noqa: E402
import judge_io  # noqa: E402
import judge_state  # noqa: E402

JUDGE_FILES = {"checker": "check.py", "contest": "contest.py"}


def load_judge_file(path: str) -> dict:
    """The task's check.py / contest.py as a namespace: compiled from its text, in no sys.path
    and no sys.modules."""
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        namespace = {"__name__": "wharf_judge_spec", "__file__": path}
        exec(compile(source, path, "exec"), namespace)
    except Exception as e:  # noqa: BLE001 - any fault of the task's own file is an infra fault
        raise grading.GradingError(f"{path}: cannot load ({type(e).__name__}: {e})") from e
    return namespace


def run_checker(namespace: dict, names: list[str], state: judge_state.State) -> dict:
    results = {}
    for name in names:
        fn = namespace.get(name.split("::")[-1])
        if not callable(fn):
            raise grading.GradingError(f"check.py has no check {name.split('::')[-1]!r} (named in spec.json)")
        try:
            fn(state)
            results[name] = {"passed": True}
        except Exception as e:  # noqa: BLE001 - a failed check, whatever it raised
            results[name] = {"passed": False, "why": reason(e)}
    return results


def reason(e: BaseException) -> str:
    try:
        return f"{type(e).__name__}: {str(e)[:500]}"
    except Exception:  # noqa: BLE001 - a message that cannot be made (an answer's repr raising)
        return type(e).__name__


def plain(value):
    """The reference's value as it would come back over JSON (tuples become lists)."""
    return json.loads(json.dumps(value))


def same(got, want) -> bool:
    """== as a pytest assert has it, floats within 1e-9 relative (another correct summation)."""
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(same(g, w) for g, w in zip(got, want))
    if isinstance(got, float) or isinstance(want, float):
        return (isinstance(got, (int, float)) and isinstance(want, (int, float))
                and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12))
    return got == want


def disagree(agree, got: dict, want) -> str | None:
    """Why an answer is wrong, or None. Whatever the answer makes the comparison raise (an int too
    large for a float, a list nested too deep) is a wrong answer, never a crash of the grader."""
    if "error" in got:
        return "the code under test raised or sent no answer"
    try:
        return None if bool(agree(got["value"], want)) else "not the expected value"
    except Exception as e:  # noqa: BLE001 - a hostile answer, whatever it makes the comparison raise
        return f"the comparison raised {type(e).__name__}: {str(e)[:200]}"


def shown(value, limit: int = 2000):
    """A value for grading.json: itself when it encodes in under `limit` characters, else the
    start of its repr (an answer cannot make the verdict unwritable or huge)."""
    try:
        if len(json.dumps(value, allow_nan=False)) <= limit:
            return value
    except (ValueError, TypeError, RecursionError):
        pass
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        text = f"<{type(value).__name__}>"
    return {"shortened": text[:limit]}


def run_contest(namespace: dict, names: list[str], workdir: str, python: str, timeout: float, seed: int) -> dict:
    rng, checks, results = random.Random(seed), namespace.get("CHECKS"), {}
    for name in names:
        short = name.split("::")[-1]
        check = checks.get(short) if isinstance(checks, dict) else None
        if not isinstance(check, dict):
            raise grading.GradingError(f"contest.py has no CHECKS[{short!r}] (named in spec.json)")
        inputs = [tuple(args) for args in check["inputs"](rng)]
        want = [plain(check["reference"](*args)) for args in inputs]
        module, function = check.get("module", namespace.get("MODULE")), check.get("function", short)
        run = judge_calls.run_batch(python, workdir, [(module, function, list(a)) for a in inputs], timeout)
        agree = check.get("same", same)
        why = [disagree(agree, got, want[i]) for i, got in enumerate(run["answers"])]
        wrong = [i for i, w in enumerate(why) if w is not None]
        result = {"passed": not wrong and not run["timed_out"] and not run["survivors"], "cases": len(inputs),
                  "wrong": len(wrong), "timed_out": run["timed_out"], "survivors": run["survivors"]}
        if wrong:
            i = wrong[0]
            result["first_wrong"] = {"args": shown(plain(list(inputs[i]))), "answer": shown(run["answers"][i]),
                                     "expected": shown(want[i]), "why": why[i], "stderr": run["stderr"][-500:]}
        results[name] = result
    return results


def verdict(kind: str, spec: dict, results: dict) -> tuple[dict, dict]:
    f2p = [n for n in spec["FAIL_TO_PASS"] if results[n]["passed"]]
    p2p = [n for n in spec["PASS_TO_PASS"] if results[n]["passed"]]
    resolved = len(f2p) == len(spec["FAIL_TO_PASS"]) and len(p2p) == len(spec["PASS_TO_PASS"])
    timed_out = any(r.get("timed_out") for r in results.values())
    numbers = {"reward": 1.0 if resolved else 0.0, "resolved": int(resolved), "log_ok": 1,
               "f2p_passed": len(f2p), "f2p_total": len(spec["FAIL_TO_PASS"]),
               "p2p_passed": len(p2p), "p2p_total": len(spec["PASS_TO_PASS"]),
               "timed_out": int(timed_out), f"judge_{kind}": 1, "confined": int(jail.unavailable() is None)}
    detail = {"instance_id": spec["instance_id"], "grader": kind, "reward": numbers["reward"], "resolved": resolved,
              "checks": results, "confinement": jail.unavailable() or jail.CONFINED, "error": None}
    return numbers, detail


def grade(args: argparse.Namespace) -> tuple[dict, dict, bytes | None]:
    spec = grading.load_spec(os.path.join(args.tests, "spec.json"))
    namespace = load_judge_file(os.path.join(args.tests, JUDGE_FILES[args.kind]))
    reward_key = judge_io.take_reward_key(args.reward_key)
    if args.hide_spec:  # before any code under test runs: it never reads the reference
        for name in os.listdir(args.tests):
            judge_io.remove(os.path.join(args.tests, name))
    names = spec["FAIL_TO_PASS"] + spec["PASS_TO_PASS"]
    if args.kind == "checker":
        results = run_checker(namespace, names, judge_state.State(args.workdir, args.python, args.timeout))
    else:
        seed = secrets.randbits(64)
        results = run_contest(namespace, names, os.path.abspath(args.workdir), args.python, args.timeout, seed)
    numbers, detail = verdict(args.kind, spec, results)
    if args.kind == "contest":
        detail["seed"] = seed
    return numbers, detail, reward_key


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="judge.py", description=__doc__.split("\n")[0])
    ap.add_argument("kind", choices=sorted(JUDGE_FILES))
    ap.add_argument("--tests", required=True, help="the task's tests dir: spec.json and check.py or contest.py")
    ap.add_argument("--workdir", required=True, help="the workspace the agent left")
    ap.add_argument("--out", default="/logs/verifier", help="dir for reward.json and grading.json")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per batch of calls (then killed: wrong)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that runs the code under test")
    ap.add_argument("--reward-key", help="the sandbox's reward key file (wharf/collect/sandbox/rewardproof.py)")
    ap.add_argument("--hide-spec", action="store_true", help="remove the tests dir's files once read (the sandbox's copy)")
    args = ap.parse_args(argv)
    judge_io.harden()
    try:
        numbers, detail, reward_key = grade(args)
    except (grading.GradingError, KeyError, TypeError, ValueError) as e:  # the task's spec, not the agent
        print(f"judge.py: error: {type(e).__name__}: {e}", file=sys.stderr)
        os.makedirs(args.out, exist_ok=True)
        judge_io.remove(os.path.join(args.out, "reward.json"))
        judge_io.write_json(os.path.join(args.out, "grading.json"), {"error": str(e), "reward": None})
        return 2
    judge_io.write_verdict(args.out, numbers, detail, reward_key)
    failed = [n for n, r in detail["checks"].items() if not r["passed"]]
    print(f"judge.py: {detail['instance_id']}: {args.kind} judge: reward {numbers['reward']} "
          f"(FAIL_TO_PASS {numbers['f2p_passed']}/{numbers['f2p_total']}, "
          f"PASS_TO_PASS {numbers['p2p_passed']}/{numbers['p2p_total']})" + (f"; failed: {failed}" if failed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
