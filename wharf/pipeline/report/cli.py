"""`wharf report RUN_DIR` writes RUN_DIR/report.html (make report RUN=...);
`wharf report --compare LABEL=RUN_DIR ... --out FILE.png` draws the mean reward of
several runs side by side; when the labels pair `grpo-s<N>` with `zero-s<N>` (the multi-turn
experiment's arms), it prints GRPO minus control per seed and round and draws that instead.
`wharf report --table RUN_DIR ...` prints the runs as a markdown table (table.py)."""
from __future__ import annotations

from pathlib import Path

from wharf.core.entry import ArgParser, guarded
from wharf.core import storage
from wharf.core.errors import WharfError
from wharf.core.layout import RunLayout

from . import gather, write_report
from .data import round_line
from .experiment import pair_arms, summary_lines
from .plots import compare_rewards, experiment_figure
from .table import table_lines


def _mean_round_wall(rounds) -> float | None:
    """Mean wall time of the whole rounds (collect through train)."""
    walls = [sum(r.walls.get(s, 0.0) for s in ("collect", "convert", "train", "publish"))
             for r in rounds if not r.partial and {"collect", "train"} <= set(r.walls)]
    return sum(walls) / len(walls) if walls else None


def main(argv: list[str] | None = None, prog: str = "wharf report") -> int:
    p = ArgParser(prog=prog, description="Write a run's report.html, or draw runs' rewards side by side.")
    p.add_argument("run_dirs", nargs="*", help="run dirs (runs/<run>) to write report.html for")
    p.add_argument("--compare", nargs="+", metavar="LABEL=RUN_DIR", help="runs to draw side by side")
    p.add_argument("--out", default=None, help="the --compare figure to write (.png, .svg or .pdf)")
    p.add_argument("--table", action="store_true", help="print the run dirs as a markdown table (rounds, held-out "
                   "evaluation) instead of writing their report.html")
    args = p.parse_args(argv)
    if not args.run_dirs and not args.compare:
        p.error("name a run dir, or --compare LABEL=RUN_DIR ...")
    if args.table and not args.run_dirs:
        p.error("--table: name the run dirs to put in it")
    if args.compare and not args.out:
        p.error("--compare: name the figure to write with --out FILE.png")
    if args.out and (not args.compare or Path(args.out).suffix not in (".png", ".svg", ".pdf")):
        p.error(f"--out {args.out}: " + ("the figure of --compare; without it nothing is drawn" if not args.compare
                                         else "name a .png, .svg or .pdf file"))
    return guarded(prog, lambda: _report(args))


def _report(args) -> int:
    if args.table:
        return _table(args.run_dirs)
    for d in args.run_dirs:
        if storage.is_remote(d):
            storage.check(d)
        elif not Path(d).is_dir() or not RunLayout(Path(d)).rounds():
            raise WharfError(f"{d} is not a run dir with rounds (runs/<run>/rounds/<k>/)")
        page = write_report(d)
        print(f"wrote {storage.describe(page)}")
    if args.compare:
        _compare(args)
    return 0


def _check_runs(items: list[str]) -> None:
    """Every --compare LABEL=RUN_DIR names a run dir with rounds, before anything is drawn."""
    for item in items:
        d = item.rpartition("=")[2]
        if storage.is_remote(d):
            storage.check(d)
        elif not Path(d).is_dir() or not RunLayout(Path(d)).rounds():
            raise WharfError(f"--compare {item}: {d} is not a run dir with rounds (runs/<run>/rounds/<k>/)")


def _compare(args) -> None:
    _check_runs(args.compare)
    runs = {}
    for item in args.compare:
        label, _, d = item.rpartition("=")
        label = label or Path(d).name
        runs[label] = gather(d)
        w = _mean_round_wall(runs[label])
        rewards = " ".join("-" if r.mean_reward is None else f"{r.mean_reward:.3f}" for r in runs[label] if not r.partial)
        print(f"{label}: mean reward per round {rewards}" + (f"; {w / 60:.1f} min/round" if w else ""))
        for r in runs[label]:
            print(f"  {round_line(r)}")
    pairs = pair_arms(runs)
    for line in summary_lines(pairs):
        print(line)
    out = experiment_figure(runs, pairs, Path(args.out)) if pairs else compare_rewards(runs, Path(args.out))
    print(f"wrote {out}")


def _table(run_dirs: list[str]) -> int:
    from wharf.pipeline.eval import task_families  # the families the eval clusters its intervals by

    for d in run_dirs:
        if not Path(d).is_dir() or not RunLayout(Path(d)).rounds():
            raise WharfError(f"{d}: not a run dir with rounds (runs/<run>/rounds/<k>/)")
    for line in table_lines(run_dirs, lambda ds: task_families(ds) if Path(ds).is_dir() else {}):
        print(line)
    return 0
