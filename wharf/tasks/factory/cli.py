"""`wharf tasks make`: real-repository bug-fix tasks from Python packages' source distributions.

    wharf tasks make PACKAGE[==VERSION]... [--from FILE] --out DIR [--max N] [--seed S]
                     [--manifests DIR] [--tries T] [--no-check | --checked-only] [--redteam N] [--jobs N]
                     [--shard K/N]

Per package version: the sdist and a test env once into $WHARF_CACHE/tasks; the manifest of kept
bugs read from --manifests when one is there for that version and seed (else the bugs are hunted
and the manifest written there); then the task dirs made under --out, each checked (the first
--redteam of them by the red team too). One line per package; exit 2 when a package cannot give
tasks (said in one line why), 1 on another failure. --checked-only makes only the tasks whose
bug holds a pass of today's judge in its manifest (what to train on), checks and hunts nothing,
and writes no manifest.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from wharf.core import atomic

from . import make, package
from .package import FactoryError


def parser(prog: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("packages", nargs="*", metavar="PACKAGE[==VERSION]")
    ap.add_argument("--from", dest="from_file", type=Path, help="a packages.txt: one PACKAGE==VERSION a line, "
                    "optionally deps=A,B (more test deps) and args=X,Y (more pytest arguments)")
    ap.add_argument("--out", type=Path, required=True, help="where the task dirs go")
    ap.add_argument("--max", type=int, default=30, help="tasks at most per package version, hunted or made from a manifest (default 30)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tries", type=int, default=0, help="mutations tried at most per package (default 6 x --max)")
    ap.add_argument("--manifests", type=Path, help="dir of manifests: read when there, written when made "
                    "(default: OUT/manifests)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--no-check", action="store_true", help="keep tasks without running the checker")
    mode.add_argument("--checked-only", action="store_true", help="make only the tasks whose bug holds a pass "
                      "of today's judge (the manifest's `checked`); run no check and no hunt")
    ap.add_argument("--jobs", type=int, default=1, help="tasks checked at once, each running up to 4 trials at "
                    "once (default 1; a machine of 4N cores takes N)")
    ap.add_argument("--redteam", type=int, default=1, metavar="N", help="the first N tasks of each package also "
                    "face the red team's scripted attackers (wharf tasks check --redteam; default 1, 0: none)")
    ap.add_argument("--shard", metavar="K/N", help="only the K-th of N shares of the packages (every N-th from "
                    "the K-th, in order): N machines, each with its own share, make a long list together, "
                    "each writing only its own packages' manifests")
    return ap


def _entries(args) -> list[make.Entry]:
    entries = [make.Entry(s) for s in args.packages]
    for e in entries:
        make.package.parse_spec(e.spec)
    if args.from_file:
        try:
            text = args.from_file.read_text()
        except OSError as e:
            raise FactoryError(f"--from {args.from_file}: cannot read it ({e.strerror})") from None
        entries += make.parse_entries(text, str(args.from_file))
    if not entries:
        raise FactoryError("name at least one PACKAGE[==VERSION] or give --from FILE")
    return _share(entries, args.shard) if args.shard else entries


def _share(entries: list[make.Entry], shard: str) -> list[make.Entry]:
    """The K-th of N interleaved shares (K from 1): a share of packages of every size, not the list's tail."""
    k, _, n = shard.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise FactoryError(f"--shard {shard}: expected K/N with 1 <= K <= N, e.g. --shard 2/4")
    return entries[int(k) - 1::int(n)]


def _write_manifest(path: Path, manifest: dict) -> None:
    """Whole or not at all (a run stopped mid-write leaves the last manifest)."""
    atomic.write_json(path, manifest)


def one(entry: make.Entry, args, opts: make.Options) -> dict:
    t0 = time.monotonic()
    manifests = args.manifests or args.out / "manifests"
    name, version = package.parse_spec(entry.spec)
    found = None
    if args.checked_only and version:  # a missing manifest said before minutes of building the env
        found = _checked_bugs(manifests / make.manifest_name(name, version, args.seed), name, version)
    pkg = make.fetch(entry)
    path = manifests / make.manifest_name(pkg.name, pkg.version, args.seed)
    if args.checked_only:
        return _checked_only(pkg, found or _checked_bugs(path, pkg.name, pkg.version), args, opts, t0)
    with make.manifest_lock(path, opts.log):  # one writer a manifest: a second make of it waits here
        return _make(pkg, entry.spec, path, args, opts, t0)


def _make(pkg, spec: str, path: Path, args, opts: make.Options, t0: float) -> dict:
    manifests = path.parent
    manifest = make.load_manifest(path)
    make.envs.build_env(pkg, opts.log, manifest.get("env") if manifest else None)
    if manifest is None:
        manifest = make.hunt_bugs(pkg, opts)
        if not manifest["bugs"]:
            raise FactoryError(f"{spec}: no mutation of its covered functions made a passing test fail "
                               f"({manifest['stats']['tried']} tried)")
    manifest = make.with_env(manifest, pkg)  # the checks below run in this env: the manifest says which
    manifests.mkdir(parents=True, exist_ok=True)
    made, dropped = make.materialise(pkg, manifest, args.out, opts, save=lambda m: _write_manifest(path, m))
    if not made:
        raise FactoryError(f"{spec}: none of its {len(manifest['bugs'])} bugs passed the check")
    if dropped:
        drop = set(dropped)
        manifest["bugs"] = [b for b in manifest["bugs"] if make.taskdir.task_id(pkg, b) not in drop]
        manifest["stats"]["dropped_by_check"] = manifest["stats"].get("dropped_by_check", 0) + len(dropped)
    _write_manifest(path, manifest)
    secs = time.monotonic() - t0
    print(f"{pkg.name}=={pkg.version}: {len(made)} tasks ({manifest['stats']['kept']} kept of "
          f"{manifest['stats']['tried']} tried, {len(dropped)} failed the check) in {secs:.0f} s", flush=True)
    return {"package": pkg.name, "version": pkg.version, "tasks": len(made), "seconds": round(secs, 1),
            **manifest["stats"]}


def _checked_bugs(path: Path, name: str, version: str) -> tuple[dict, list[dict]]:
    """(the manifest at path, its bugs that passed today's judge); FactoryError when there are none."""
    manifest = make.load_manifest(path)
    if manifest is None:
        raise FactoryError(f"{name}=={version}: no manifest at {path}: run wharf tasks make without --checked-only first")
    digest = make.verify.judge_digest()
    checked = make.verify.checked_bugs(manifest, digest)
    if not checked:
        raise FactoryError(f"{name}=={version}: none of its {len(manifest['bugs'])} bugs holds a check under today's "
                           f"judge ({digest}) and env lock ({make.verify.env_digest(manifest)}): run wharf tasks "
                           "make without --checked-only to check them")
    return manifest, checked


def _checked_only(pkg, found: tuple[dict, list[dict]], args, opts: make.Options, t0: float) -> dict:
    """The task dirs of the bugs that passed today's judge (`found`: _checked_bugs's); the
    manifest itself is left as it is."""
    manifest, checked = found
    make.envs.build_env(pkg, opts.log, manifest.get("env"))
    view = {**manifest, "bugs": checked}
    made, _ = make.materialise(pkg, view, args.out, dataclasses.replace(opts, check=False))
    secs = time.monotonic() - t0
    print(f"{pkg.name}=={pkg.version}: {len(made)} tasks that passed the check (of {len(manifest['bugs'])} in "
          f"the manifest) in {secs:.0f} s", flush=True)
    return {"package": pkg.name, "version": pkg.version, "tasks": len(made), "seconds": round(secs, 1),
            "checked": len(checked), **manifest["stats"]}


def main(argv: list[str] | None = None, prog: str = "wharf tasks make", check=None) -> int:
    """`check`: wharf tasks check's check_task (the `wharf tasks` dispatcher hands it in)."""
    args = parser(prog).parse_args(argv)
    opts = make.Options(max_tasks=args.max, seed=args.seed, tries=args.tries, check=not args.no_check,
                        redteam=args.redteam, jobs=args.jobs, checker=check,
                        log=lambda s: print(s, file=sys.stderr, flush=True))
    try:
        entries = _entries(args)
    except FactoryError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    existed, t0 = args.out.exists(), time.monotonic()
    bad, results = 0, []
    for k, entry in enumerate(entries, 1):
        if len(entries) > 1:  # where a long make is (its lines come as each package ends)
            opts.log(f"[{k}/{len(entries)}] {entry.spec}")
        try:
            results.append(one(entry, args, opts))
        except FactoryError as e:
            print(f"{prog}: {e}", file=sys.stderr)
            bad += 1
    if results:
        atomic.write_json(args.out / "make_report.json", results)
    elif not existed and args.out.is_dir() and not any(args.out.iterdir()):
        args.out.rmdir()
    if len(entries) > 1:
        print(_total(results, bad, time.monotonic() - t0, args.out), flush=True)
    return 2 if bad else 0


def _total(results: list[dict], bad: int, seconds: float, out: Path) -> str:
    """The last line of a make of many packages."""
    line = f"{len(results)} package versions: {sum(r['tasks'] for r in results)} tasks in {out} in {seconds / 60:.1f} min"
    return line + (f"; {bad} could not give tasks (said above)" if bad else "")


if __name__ == "__main__":
    sys.exit(main())
