"""The hunt's tries, each as a fresh pytest process (suite.run) and forked from one warm pytest
(suite.Server), side by side: wall and CPU seconds per try, and whether both found the same bugs.

    python bench/factory_tries.py PACKAGE==VERSION [--tries N]     (the package's sdist and env cached)
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from wharf.tasks.factory import hunt, make, mutate, suite


def _cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def _timed(label, pkg, work, base, muts, server):
    w0, c0, found = time.monotonic(), _cpu(), []
    for m in muts:
        bug = hunt.try_one(pkg, work, base, m, 0, server)
        found.append(None if bug is None else (bug.fail_to_pass, bug.pass_to_pass))
    if server:
        server.close()  # its children's CPU is counted once it has been waited for
    wall, cpu = time.monotonic() - w0, _cpu() - c0
    print(f"{label:<22} {wall / len(muts):>8.2f} {cpu / len(muts):>8.2f}", flush=True)
    return found


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("--tries", type=int, default=12)
    args = ap.parse_args()
    pkg = make.prepare(make.Entry(args.spec), lambda s: None)
    with tempfile.TemporaryDirectory() as tmp:
        work = suite.working_copy(pkg, Path(tmp))
        base = suite.baseline(pkg, work, 600)
        muts = []
        for m in hunt.plan(pkg, work, base, 0):
            m = mutate.finish((work / m.file).read_text(encoding="utf-8"), m)
            if m is not None:
                muts.append(m)
            if len(muts) == args.tries:
                break
        print(f"{pkg.key}: {len(muts)} tries, {len(base.passing)} passing tests")
        print(f"{'runner':<22} {'wall s':>8} {'cpu s':>8}   (per try)")
        fresh = _timed("fresh process", pkg, work, base, muts, None)
        forked = _timed("forked (--serve)", pkg, work, base, muts, suite.Server(pkg, work))
    same = fresh == forked
    print(f"same bugs, FAIL_TO_PASS and PASS_TO_PASS: {same} ({sum(f is not None for f in fresh)} kept)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
