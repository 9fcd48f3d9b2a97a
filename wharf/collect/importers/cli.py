"""`wharf import OUT FILE|DIR ... [--reward R] [--task ID] [--strict]` (wharf/collect/importers/__init__.py)."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from wharf.core.entry import ArgParser, guarded

from . import import_trajectories


def finite(text: str) -> float:
    value = float(text)  # argparse reports a ValueError as "invalid finite value"
    if not math.isfinite(value):
        raise ValueError(text)
    return value





def main(argv: list[str] | None = None, prog: str = "wharf import") -> int:
    p = ArgParser(prog=prog, description=(
        "Trajectory files (harbor's ATIF trajectory.json, mini-swe-agent's trajectory, wharf's minimal agent's "
        "trajectory.json) -> a collect dir of text-only rows, for convert.mode=sft."))
    p.add_argument("out", type=Path, help="the collect dir to write (new or empty)")
    p.add_argument("inputs", type=Path, nargs="+", help="trajectory files, or dirs to search (a harbor job dir)")
    p.add_argument("--reward", type=finite, default=None,
                   help="the reward of files without a harbor verifier result beside them")
    p.add_argument("--task", default=None,
                   help="the task id of every file (default: harbor's task name, else the file's, else its trial dir's)")
    p.add_argument("--strict", action="store_true",
                   help="refuse the import at the first file of a dir that cannot be read (default: skip and report it)")
    args = p.parse_args(argv)
    return guarded(prog, lambda: _run(args, prog))


def _run(args: argparse.Namespace, prog: str) -> int:
    m = import_trajectories(args.inputs, args.out, args.reward, args.task, args.strict)
    for s in m["skipped"]:
        print(f"{prog}: skipped {s['error']}", file=sys.stderr)
    skipped = f"; skipped {len(m['skipped'])} files (listed above, and in its manifest.json)" if m["skipped"] else ""
    print(f"imported {m['counts']['finished']} trajectories ({m['counts']['turns']} calls, text-only; "
          f"mean reward {m['mean_reward']:.3f}) into {args.out}{skipped}: convert them with convert.mode=sft "
          f"convert.jobs=[{args.out}]")
    return 0
