"""Finding the mutations that make a real bug: a passing test now fails, the others still pass.

Speed: each try runs one pytest process on a bounded selection: the passing tests that cover the
mutated function (at most COVERING of them) plus at most OTHERS other passing tests of the same
test files. FAIL_TO_PASS is what of that selection fails, PASS_TO_PASS what still passes: both
verified on this run, nothing assumed. Then those tests alone run on the pristine source (the
control), as the judge will run them, and only the ones that pass there are kept. The order of tries is a shuffle drawn from the seed, taken
round-robin over the covered functions so that the kept bugs spread over the package.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import mutate, suite
from .package import Package

COVERING = 60
OTHERS = 40
PER_FUNCTION = 2  # kept bugs at most per function


@dataclass
class Bug:
    mutation: mutate.Mutation
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    messages: dict = field(default_factory=dict)  # FAIL_TO_PASS id -> its crash message

    def record(self) -> dict:
        return {**asdict(self.mutation), "FAIL_TO_PASS": self.fail_to_pass, "PASS_TO_PASS": self.pass_to_pass,
                "messages": self.messages}


def plan(pkg: Package, work: Path, base: suite.Baseline, seed: int) -> list[mutate.Mutation]:
    """Every candidate mutation of the covered functions, in the seed's round-robin order."""
    rng = random.Random(f"{pkg.key}:{seed}")
    per_func: list[list[mutate.Mutation]] = []
    sources: dict[str, str] = {}
    for file, qualname, line in sorted(base.covers):
        if file not in sources:
            try:
                sources[file] = (work / file).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                sources[file] = ""
        try:
            cands = mutate.candidates(sources[file], file, qualname, line) if sources[file] else []
        except SyntaxError:
            cands = []
        if cands:
            rng.shuffle(cands)
            per_func.append(cands)
    rng.shuffle(per_func)
    order = []
    for r in range(max((len(c) for c in per_func), default=0)):
        order += [c[r] for c in per_func if r < len(c)]
    return order


def selection(base: suite.Baseline, m: mutate.Mutation, rng: random.Random) -> list[str]:
    covering = suite.sample(base.covers[(m.file, m.function, m.def_line)], COVERING, rng)
    files = {t.split("::")[0] for t in covering}
    chosen = set(covering)
    others = [t for t in base.passing if t.split("::")[0] in files and t not in chosen]
    picked = set(covering) | set(suite.sample(others, OTHERS, rng))
    return [t for t in base.passing if t in picked]  # the suite's own order


def try_one(pkg: Package, work: Path, base: suite.Baseline, m: mutate.Mutation, seed: int,
            server: suite.Server | None = None) -> Bug | None:
    """Apply m in `work`, run its selection (through `server` when given), put the file back; the
    bug, or None."""
    rng = random.Random(f"{m.id}:{seed}")
    chosen = selection(base, m, rng)
    path = work / m.file
    original = path.read_bytes()
    path.write_text(mutate.apply(original.decode("utf-8"), m), encoding="utf-8")  # m: finished (make.py)
    try:
        timeout = max(30.0, 3 * base.seconds)
        out = server.run(chosen, timeout) if server else suite.run(pkg, work, chosen, cover=False, timeout=timeout)
    finally:
        path.write_bytes(original)
    if out.timed_out:
        return None
    f2p = [t for t in chosen if out.tests.get(t, {}).get("outcome") == "failed"]
    p2p = [t for t in chosen if out.tests.get(t, {}).get("outcome") == "passed"]
    if f2p:  # the spec's tests alone, as the judge runs them (--only-spec), on the pristine source
        spec = f2p + p2p
        control = server.run(spec, timeout) if server else suite.run(pkg, work, spec, cover=False, timeout=timeout)
        f2p, p2p = _passing(control, f2p), _passing(control, p2p)
    if not f2p:
        return None
    return Bug(m, f2p, p2p, {t: out.tests[t]["message"] for t in f2p[:3]})


def _passing(control: suite.Outcome, tests: list[str]) -> list[str]:
    """The tests that pass without the bug when only the spec's tests run. One that fails needs a
    test the selection left out (pathspec's test_02_* read what its test_01_* set): it failed for
    that, not for the bug, and would fail the fixed code too."""
    if control.timed_out:
        return []
    return [t for t in tests if control.tests.get(t, {}).get("outcome") == "passed"]
