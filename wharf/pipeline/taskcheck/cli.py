"""`wharf tasks check DIR... [--runs N] [--redteam] [--report FILE] [--jobs N] [--keep DIR]`

Each DIR is a harbor task dir, or a dir of them (datasets/toy). Every task's format is checked
first: one broken task dir is one line naming its file and field, exit 2, and nothing runs or
is written. Then, task by task, the oracle 1.0 and the untouched workspace 0 over --runs runs,
the tier-1 exploits (and with --redteam the red team's attackers) 0 each: one line per task, ok
or FAILED and why, with the seconds each tier took; the JSON report at --report (default
runs/tasks-check/<UTC time>.json); exit 1 when any task fails."""
from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

from wharf.core import atomic
from wharf.tasks.check.records import TaskVerdict
from wharf.tasks.check.taskformat import TaskFormatError, read_task, task_dirs

REPORTS = Path("runs") / "tasks-check"


def parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Validate task dirs: the format, the oracle 1.0 and the "
                                "untouched workspace 0 on every run, the hackability audit (docs/tasks.md).")
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="task dirs, or dirs of task dirs")
    p.add_argument("--runs", type=int, default=3, help="oracle and untouched runs each (default 3)")
    p.add_argument("--redteam", action="store_true", help="tier 2: the red team's scripted attackers too")
    p.add_argument("--report", type=Path, help=f"the JSON report (default {REPORTS}/<UTC time>.json)")
    p.add_argument("--jobs", type=int, default=4, help="trials at once (default 4)")
    p.add_argument("--keep", type=Path, help="keep the harbor trial dirs under this dir (default: removed)")
    return p


def report(verdicts: list[TaskVerdict], args: argparse.Namespace, seconds: float) -> dict:
    return {"ok": all(v.ok for v in verdicts), "tasks": len(verdicts), "failed": sum(not v.ok for v in verdicts),
            "runs": args.runs, "redteam": args.redteam, "seconds": round(seconds, 1),
            "verdicts": [v.to_json() for v in verdicts]}


def _write(path: Path, data: dict) -> None:
    atomic.write_json(path, data)


async def _check_all(tasks: list[Path], args: argparse.Namespace, work: Path) -> list[TaskVerdict]:
    from wharf.pipeline.taskcheck import check_async

    out = []
    for i, task in enumerate(tasks):
        verdict = await check_async(task, runs=args.runs, redteam=args.redteam, jobs=args.jobs, work=work / str(i))
        print(verdict.line(), flush=True)
        out.append(verdict)
    return out


def main(argv: list[str] | None = None, prog: str = "wharf tasks check") -> int:
    args = parser(prog).parse_args(argv)
    if args.runs < 1 or args.jobs < 1:
        print(f"{prog}: --runs and --jobs must be at least 1", file=sys.stderr)
        return 2
    missing = [d for d in args.dirs if not d.is_dir()]
    if missing:
        print(f"{prog}: {missing[0]}: not a directory", file=sys.stderr)
        return 2
    tasks = task_dirs(args.dirs)
    try:
        for task in tasks:
            read_task(task)
    except TaskFormatError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    start = time.monotonic()
    work = args.keep or Path(tempfile.mkdtemp(prefix="wharf-tasks-check-"))
    try:
        verdicts = asyncio.run(_check_all(tasks, args, work))
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    path = args.report or REPORTS / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    _write(path, report(verdicts, args, time.monotonic() - start))
    failed = [v for v in verdicts if not v.ok]
    print(f"{len(verdicts) - len(failed)}/{len(verdicts)} tasks ok; report {path}")
    return 1 if failed else 0
