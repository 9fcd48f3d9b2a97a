"""The figures of a manifest dir: per package version the tests that pass twice, the covered
functions, the mutations tried and kept (yield), the hunt's seconds and seconds per kept bug, and
how many bugs passed `wharf tasks check` under the judges' code as it is now, in the env their
manifest locks (`checked`); with --tasks DIR, the disk of the task dirs made from them beside
the manifests' own.

    wharf tasks stats datasets/real/manifests [--tasks DIR]

A file in the dir that is not a manifest is named in a line on stderr and left out (exit 2).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from .verify import checked_bugs, judge_digest


def row(path: Path, judge: str) -> dict:
    """A manifest's figures; `checked`: the check records of its bugs that name `judge`."""
    m = json.loads(path.read_text())
    s = m["stats"]
    return {"package": f"{m['package']}=={m['version']}", "passing": s["passing"],
            "functions": s["covered_functions"], "tried": s["tried"], "kept": len(m["bugs"]),
            "yield": s["kept"] / s["tried"] if s["tried"] else 0.0, "seconds": s["seconds"],
            "bytes": path.stat().st_size, "checked": [b["checked"] for b in checked_bugs(m, judge)]}


def rows(manifests: Path, judge: str) -> tuple[list[dict], list[str]]:
    """(a row per manifest, a line per file that is not a manifest: which file, what is wrong)."""
    out, bad = [], []
    for path in sorted(manifests.glob("*.json")):
        try:
            out.append(row(path, judge))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            what = f"no field {e}" if isinstance(e, KeyError) else str(e) or type(e).__name__
            bad.append(f"{path}: not a wharf tasks make manifest ({what}); left out of the figures")
    return out, bad


def checks_line(records: list[dict], judge: str) -> str:
    """How many bugs passed today's judge in their manifests' locked envs, how many the red team
    too, what a check took (median)."""
    tier1 = [r["seconds"] for r in records if not r.get("tier2")]
    tier2 = [r["seconds"] for r in records if r.get("tier2")]
    line = f"{len(records)} passed wharf tasks check under the judge as it is now ({judge}), in their locked envs"
    if tier2:
        line += f", {len(tier2)} of them with the red team (tier 2)"
    if tier1:
        line += f"; a check {statistics.median(tier1):.1f} s (median)"
    if tier2:
        line += f", with the red team {statistics.median(tier2):.1f} s"
    return line


def disk(path: Path) -> int:
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(path) for f in files)


def main(argv: list[str] | None = None, prog: str = "python -m wharf.tasks.factory.stats") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("manifests", type=Path)
    ap.add_argument("--tasks", type=Path, help="a dir of task dirs made from these manifests")
    args = ap.parse_args(argv)
    judge = judge_digest()
    table, bad = rows(args.manifests, judge)
    for line in bad:
        print(line, file=sys.stderr)
    if not table:
        print(f"{args.manifests}: no manifests", file=sys.stderr)
        return 2
    print(f"{'package':<28} {'passing':>7} {'funcs':>5} {'tried':>5} {'kept':>4} {'yield':>5} {'hunt s':>6} {'s/kept':>6} {'checked':>7}")
    for r in table:
        per = r["seconds"] / r["kept"] if r["kept"] else float("nan")
        print(f"{r['package']:<28} {r['passing']:>7} {r['functions']:>5} {r['tried']:>5} {r['kept']:>4} "
              f"{r['yield']:>5.2f} {r['seconds']:>6.0f} {per:>6.1f} {len(r['checked']):>7}")
    kept, tried, secs = (sum(r[k] for r in table) for k in ("kept", "tried", "seconds"))
    print(f"{len(table)} package versions: {kept} bugs kept of {tried} tried (yield {kept / max(tried, 1):.2f}), "
          f"{secs:.0f} s of hunting ({secs / max(kept, 1):.1f} s per kept bug); manifests "
          f"{sum(r['bytes'] for r in table) / max(kept, 1) / 1024:.1f} KiB per task")
    print(checks_line([c for r in table for c in r["checked"]], judge))
    if args.tasks:
        dirs = [p for p in args.tasks.iterdir() if p.is_dir() and "__" in p.name]
        total = sum(disk(p) for p in dirs)
        print(f"{len(dirs)} task dirs in {args.tasks}: {total / max(len(dirs), 1) / 1024:.0f} KiB per task dir")
    return 2 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
