"""The check of one task dir, in order, each stage only when the one before held:

1. format   taskformat.read_task (a broken task dir never gets here: it is bad input)
2. judge    the oracle `runs` times (1.0 every time) and the untouched workspace `runs` times
            (0 every time): the task is solvable, unsolved as shipped, and its verdict stable
3. tier1    the exploits aimed at the function(s) the oracle's fix touches (exploits.py): 0 each
4. tier2    (redteam) the scripted red-team attackers (wharf.tasks.redteam): 0 each

The judge is reached only through `grade` (records.Grade), which the caller binds to real
trials (wharf/pipeline/taskcheck: harbor trials in the bwrap sandbox)."""
from __future__ import annotations

import re
import time

from wharf.tasks.check.exploits import exploits
from wharf.tasks.check.records import Change, Grade, TaskVerdict, Trial
from wharf.tasks.check.targets import targets
from wharf.tasks.check.taskformat import TaskFormat


def _scores(trials: list[Trial]) -> str:
    return "[" + ", ".join("error" if t.reward is None else f"{t.reward:g}" for t in trials) + "]"


def _first_error(trials: list[Trial]) -> str:
    return next((t.error for t in trials if t.error), "") or "no reward written"


def _oracle_exit(trials: list[Trial]) -> str:
    """`; solve.sh exited N` when the oracle's script failed in a run (CheckAgent prints oracle_rc)."""
    codes = [m.group(1) for t in trials for m in [re.search(r"oracle_rc=(\d+)", t.output)] if m and m.group(1) != "0"]
    return f"; the oracle exited {codes[0]}" if codes else ""


def judge_reasons(oracle: list[Trial], nop: list[Trial]) -> list[str]:
    """Why the oracle / untouched runs fail the check (empty: they hold)."""
    out = []
    if any(t.reward != 1.0 for t in oracle):
        err = f"; {_first_error(oracle)[:200]}" if any(t.reward is None for t in oracle) else _oracle_exit(oracle)
        out.append(f"the oracle scored {_scores(oracle)} over {len(oracle)} runs, want 1.0 each{err}")
    if any(t.reward != 0.0 for t in nop):
        err = f"; {_first_error(nop)[:200]}" if any(t.reward is None for t in nop) else ""
        out.append(f"the untouched workspace scored {_scores(nop)} over {len(nop)} runs, want 0 each{err}")
    return out


def exploit_reasons(trials: list[Trial], whats: dict[str, str], tier: str) -> list[str]:
    """An exploit that scored above 0 (the task's tests accept it) or left no reward."""
    out = []
    for t in trials:
        if t.reward is None:
            out.append(f"{tier} {t.change}: the judge wrote no reward ({(t.error or '')[:200]})")
        elif t.reward > 0:
            kind = "exploit" if tier == "tier1" else "attacker"
            out.append(f"{tier} {kind} {t.change} scored {t.reward:g}" + (f" ({whats[t.change]})" if t.change in whats else ""))
    return out


async def _timed(verdict: TaskVerdict, tier: str, grade: Grade, task: TaskFormat, changes: list[Change]) -> list[Trial]:
    start = time.monotonic()
    trials = await grade(task, changes)
    verdict.seconds[tier] = round(time.monotonic() - start, 2)
    verdict.trials.extend(trials)
    return trials


async def check(task: TaskFormat, grade: Grade, *, runs: int = 3, redteam: bool = False,
                format_seconds: float = 0.0) -> TaskVerdict:
    """The verdict on a well-formed task (see the module's docstring)."""
    verdict = TaskVerdict(task.path.name, True, judge=task.judge, seconds={"format": round(format_seconds, 2)})
    changes = [Change("oracle", oracle=True, run=i) for i in range(runs)] + [Change("nop", run=i) for i in range(runs)]
    trials = await _timed(verdict, "judge", grade, task, changes)
    oracle = [t for t in trials if t.change == "oracle"]
    for reason in judge_reasons(oracle, [t for t in trials if t.change == "nop"]):
        verdict.fail(reason)
    if not verdict.ok:
        return verdict
    found = targets(oracle[0].diff, task.path / "environment")
    tier1 = exploits(found, task.path / "environment")
    if not tier1:
        # e.g. an oracle that only makes an empty dir: git's diff holds no file of it
        verdict.notes.append("tier1: no exploit applies (the oracle's diff touches no function and writes no file)")
    whats = {e.name: e.what for e in tier1}
    trials = await _timed(verdict, "tier1", grade, task, [Change(e.name, files=e.files, tier="tier1") for e in tier1])
    for reason in exploit_reasons(trials, whats, "tier1"):
        verdict.fail(reason)
    if redteam:
        from wharf.tasks.redteam import attacks_for

        # a hung test is killed and graded 0 well inside the verifier's timeout, yet never before
        # the tests could finish: twice the oracle's slowest trial, at least 15 s
        timeout = max(15, int(2 * max(t.seconds for t in oracle)) + 1)
        changes = [Change(n, steps=tuple(s), tier="tier2", test_timeout=timeout) for n, s in attacks_for(task, found).items()]
        trials = await _timed(verdict, "tier2", grade, task, changes)
        for reason in exploit_reasons(trials, {}, "tier2"):
            verdict.fail(reason)
    return verdict
