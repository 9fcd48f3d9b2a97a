"""`wharf tasks check`'s runner: the checker's logic (wharf.tasks.check, which may import only the
core) bound to real harbor trials in the bwrap sandbox (wharf.collect's), which is why this glue
stands in the pipeline, the one room that sees both.

    check_task(task_dir, *, runs=3, redteam=False) -> TaskVerdict   one task dir (runs its own event loop)
    await check_async(task_dir, runs=.., redteam=.., jobs=4, work=None)   the same from async code

The factory (`wharf tasks make`, wharf/tasks/factory) is handed check_task by the `wharf tasks`
dispatcher (wharf/pipeline/tasks.py): it cannot import it, the tasks room standing below this one."""
from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from wharf.tasks.check.audit import check
from wharf.tasks.check.records import TaskVerdict
from wharf.tasks.check.taskformat import read_task


async def check_async(task_dir: Path, *, runs: int = 3, redteam: bool = False, jobs: int = 4,
                      work: Path | None = None) -> TaskVerdict:
    from wharf.pipeline.taskcheck.grader import BwrapGrader, World
    from wharf.pipeline.taskcheck.leaks import leak_reasons

    if work is None:  # the trial dirs are kept only where the caller asks
        with tempfile.TemporaryDirectory(prefix="wharf-tasks-check-") as tmp:
            return await check_async(task_dir, runs=runs, redteam=redteam, jobs=jobs, work=Path(tmp))
    start = time.monotonic()
    task = read_task(Path(task_dir))  # TaskFormatError (bad input) before any trial
    fmt = time.monotonic() - start
    grader = BwrapGrader(work, jobs)
    if not redteam:
        return await check(task, grader, runs=runs, format_seconds=fmt)
    with World(grader.work / "world") as world:
        grader.world = world
        verdict = await check(task, grader, runs=runs, redteam=True, format_seconds=fmt)
        for reason in leak_reasons(task.path, verdict.trials) + ([world.harmed()] if world.harmed() else []):
            verdict.fail(f"tier2: {reason}")
    return verdict


def check_task(task_dir: Path, *, runs: int = 3, redteam: bool = False) -> TaskVerdict:
    """The verdict on one task dir: format, oracle 1.0 and untouched 0 over `runs` runs, the tier-1
    exploits 0 each and, with `redteam`, the red team's attackers 0 each. A malformed task dir
    raises wharf.tasks.check.taskformat.TaskFormatError (its message is the one line to print)."""
    return asyncio.run(check_async(task_dir, runs=runs, redteam=redteam))
