"""`wharf import OUT FILE|DIR ... [--reward R] [--task ID]` (wharf/collect/importers/__init__.py)."""
from __future__ import annotations

import argparse
from pathlib import Path

from wharf.core.entry import guarded

from . import import_trajectories


def main(argv: list[str] | None = None, prog: str = "wharf import") -> int:
    p = argparse.ArgumentParser(prog=prog, description=(
        "Trajectory files (harbor's ATIF trajectory.json, mini-swe-agent's trajectory) -> a collect dir of "
        "text-only rows, for convert.mode=sft."))
    p.add_argument("out", type=Path, help="the collect dir to write (new or empty)")
    p.add_argument("inputs", type=Path, nargs="+", help="trajectory files, or dirs to search (a harbor job dir)")
    p.add_argument("--reward", type=float, default=None,
                   help="the reward of files without a harbor verifier result beside them")
    p.add_argument("--task", default=None,
                   help="the task id of every file (default: harbor's task name, else the file's)")
    args = p.parse_args(argv)
    return guarded(prog, lambda: _run(args))


def _run(args) -> int:
    m = import_trajectories(args.inputs, args.out, args.reward, args.task)
    print(f"imported {m['counts']['finished']} trajectories ({m['counts']['turns']} calls, text-only; "
          f"mean reward {m['mean_reward']:.3f}) into {args.out}: convert them with convert.mode=sft "
          f"convert.jobs=[{args.out}]")
    return 0
