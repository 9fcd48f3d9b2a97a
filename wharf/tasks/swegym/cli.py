"""`python -m wharf.tasks.swegym`: select rows, check them all, then write their task dirs."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .rows import RowError, read_rows
from .spec import parse_row
from .taskdir import write_task


def convert(rows_file: Path, out_dir: Path, limit: int | None = None, ids: list[str] | None = None,
            source: str = "auto", skip_bad: bool = False, agent_timeout: float = 1800,
            verifier_timeout: float = 1800, progress: bool = False,
            bake_grader: bool = False) -> tuple[list[Path], list[str]]:
    """Rows file -> task dirs. Returns (dirs written, errors of skipped rows).

    Raises RowError (every bad row listed) before writing anything, unless skip_bad."""
    rows = read_rows(rows_file)
    selected = []
    for n, row in enumerate(rows, 1):
        if ids and not (isinstance(row, dict) and row.get("instance_id") in ids):
            continue
        selected.append((n, row))
    if ids:
        missing = set(ids) - {r.get("instance_id") for _, r in selected}
        if missing:
            raise RowError(f"{rows_file}: no row with instance_id {', '.join(sorted(missing))}")
    tasks, errors = [], []
    for n, row in selected:
        if limit is not None and len(tasks) >= limit:
            break
        try:
            tasks.append(parse_row(row, f"{rows_file}: row {n}", source))
        except RowError as e:
            errors.append(str(e))
    if errors and not skip_bad:
        raise RowError("\n".join(errors) + f"\n{len(errors)} bad row(s); nothing written (--skip-bad writes the rest)")
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(tasks), unit="task", desc="swegym", file=sys.stderr)
    written = []
    for t in tasks:
        written.append(write_task(t, out_dir, agent_timeout, verifier_timeout, bake_grader))
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    return written, errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wharf.tasks.swegym",
                                 description="SWE-Gym / SWE-bench rows -> harbor task dirs.")
    ap.add_argument("rows_file", type=Path, help=".jsonl, .json or .parquet of rows")
    ap.add_argument("out_dir", type=Path, help="where <instance_id>/ task dirs go")
    ap.add_argument("--limit", type=int, help="convert at most N rows")
    ap.add_argument("--ids", nargs="+", metavar="ID", help="only these instance_ids")
    ap.add_argument("--source", choices=("auto", "swe-gym", "swe-bench"), default="auto",
                    help="image naming and defaults; auto: SWE-bench if the row has eval_script/"
                    "image/environment_setup_commit or JSON-string test lists")
    ap.add_argument("--agent-timeout", type=float, default=1800)
    ap.add_argument("--verifier-timeout", type=float, default=1800)
    ap.add_argument("--skip-bad", action="store_true", help="write the good rows, report the bad")
    ap.add_argument("--bake-grader", action="store_true",
                    help="build environment/Dockerfile with swebench preinstalled instead of using the "
                    "image as is (saves a pip install of swebench in every verification)")
    args = ap.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        ap.error("--limit must be >= 1")
    try:
        written, errors = convert(args.rows_file, args.out_dir, args.limit, args.ids, args.source,
                                  args.skip_bad, args.agent_timeout, args.verifier_timeout,
                                  progress=sys.stderr.isatty() or bool(os.environ.get("WHARF_PROGRESS")),
                                  bake_grader=args.bake_grader)
    except RowError as e:
        print(f"swegym: error: {e}", file=sys.stderr)
        return 2
    for e in errors:
        print(f"swegym: skipped: {e}", file=sys.stderr)
    print(f"swegym: wrote {len(written)} task dir(s) to {args.out_dir}" +
          (f", skipped {len(errors)} bad row(s)" if errors else ""))
    return 0
