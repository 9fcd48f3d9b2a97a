"""One package version -> its manifest of kept bugs -> its task dirs.

The manifest (JSON, committed) is the compact form of a task set: the package version, the seed,
how its tests run, and per kept bug the mutation (file, function, line, column, operator, the
replacement text) and its spec. Task dirs are made from it and the package cache on demand
(`materialise`), byte for byte the same for the same manifest.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from . import env as envs
from . import hunt, mutate, package, suite, taskdir, verify
from .package import FactoryError, Package

MANIFEST_VERSION = 1


@dataclass
class Options:
    max_tasks: int = 30  # kept bugs per package version
    seed: int = 0
    tries: int = 0  # mutations tried at most (0: 6 x max_tasks)
    suite_timeout: float = 600.0
    check: bool = True
    checker: object = None  # wharf tasks check's check_task, when handed in (verify.check_task)
    redteam: int = 1  # the first N tasks of each package also face the red team (tier 2)
    jobs: int = 1  # tasks checked at once (each runs up to 4 trials at once)
    log: object = print


@dataclass
class Entry:
    """A line of packages.txt (or a spec on the command line)."""
    spec: str
    deps: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)


def parse_entries(text: str, where: str) -> list[Entry]:
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#")[0].split()
        if not words:
            continue
        e = Entry(words[0])
        for w in words[1:]:
            key, _, value = w.partition("=")
            if key not in ("deps", "args") or not value:
                raise FactoryError(f"{where}:{n}: {w!r}: expected deps=A,B or args=X,Y after the package")
            getattr(e, key).extend(value.split(","))
        package.parse_spec(e.spec)
        out.append(e)
    return out


def fetch(entry: Entry) -> Package:
    """The package's sdist fetched and unpacked (once), its layout found; no env yet."""
    name, version = package.parse_spec(entry.spec)
    root = package.unpack(package.fetch_sdist(name, version))
    pyroot, tests = package.find_layout(root)
    if not tests:
        raise FactoryError(f"{entry.spec}: the sdist ships no tests (no tests/ or test_*.py)")
    return Package(name, version or package.version_of(root), root, pyroot, tests, entry.deps, entry.args)


def prepare(entry: Entry, log, pins: list[str] | None = None) -> Package:
    """fetch, then the env built (once; exactly `pins`, a manifest's `env`, when given)."""
    pkg = fetch(entry)
    envs.build_env(pkg, log, pins)
    return pkg


def with_env(manifest: dict, pkg: Package) -> dict:
    """The manifest with its env's lock (`env`, before the stats), for one made before locks were kept."""
    if "env" in manifest:
        return manifest
    out = {k: v for k, v in manifest.items() if k not in ("stats", "bugs")}
    return {**out, "env": envs.freeze(pkg), "stats": manifest["stats"], "bugs": manifest["bugs"]}


def hunt_bugs(pkg: Package, opts: Options) -> dict:
    """The manifest of pkg: bugs kept from seeded mutations of its covered functions."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="wharf-factory-") as tmp:
        work = suite.working_copy(pkg, Path(tmp))
        base = suite.baseline(pkg, work, opts.suite_timeout)
        order = hunt.plan(pkg, work, base, opts.seed)
        server = suite.Server(pkg, work)  # tries run forked from one warm pytest (suite_run --serve)
        try:
            kept, tried = _tries(pkg, work, base, order, opts, server)
        finally:
            server.close()
    opts.log(f"{pkg.key}: {len(base.passing)} tests pass twice, {len(base.covers)} functions covered, "
             f"{len(order)} candidate mutations; kept {len(kept)} of {tried} tried in {time.monotonic() - t0:.0f} s")
    return {"manifest": MANIFEST_VERSION, "package": pkg.name, "version": pkg.version, "seed": opts.seed,
            "pyroot": pkg.pyroot, "test_paths": pkg.test_paths, "deps": pkg.extra_deps, "args": pkg.pytest_args,
            "suite_seconds": round(base.seconds, 2), "test_timeout": _test_timeout(base.seconds),
            "env": envs.freeze(pkg), "stats": {"passing": len(base.passing), "covered_functions": len(base.covers),
                      "candidates": len(order), "tried": tried, "kept": len(kept),
                      "seconds": round(time.monotonic() - t0, 1)},
            "bugs": kept}


def _tries(pkg: Package, work: Path, base: suite.Baseline, order: list, opts: Options, server) -> tuple[list, int]:
    """(the kept bugs' records, the mutations tried): in order, at most PER_FUNCTION per function."""
    kept, tried, per_func = [], 0, {}
    for m in order:
        if len(kept) >= opts.max_tasks or tried >= (opts.tries or 6 * opts.max_tasks):
            break
        if per_func.get((m.file, m.function), 0) >= hunt.PER_FUNCTION:
            continue
        m = mutate.finish((work / m.file).read_text(encoding="utf-8"), m)
        if m is None:
            continue
        tried += 1
        bug = hunt.try_one(pkg, work, base, m, opts.seed, server)
        if bug is not None:
            kept.append(bug.record())
            per_func[(m.file, m.function)] = per_func.get((m.file, m.function), 0) + 1
    return kept, tried


def _test_timeout(suite_seconds: float) -> int:
    return int(max(60, 10 * suite_seconds))


def materialise(pkg: Package, manifest: dict, out: Path, opts: Options, save=None) -> tuple[list[Path], list[str]]:
    """The task dirs of a manifest's first opts.max_tasks bugs (its seeded order: a sample) under
    out; with opts.check, only those that pass the check are kept (the others removed, each said
    in a line), and a pass of `wharf tasks check` is written on its bug (`checked`: the judge's
    digest, the runs, the tiers, the seconds, the date), `save(manifest)` called after each so an
    interrupted run loses no pass. A bug that already holds a pass under today's judge (and of
    tier 2 where it is wanted) is not checked again: a long make can be resumed, or grown with
    a larger --max. The first opts.redteam tasks (a sample per package) also face the red team's
    attackers; opts.jobs tasks are checked at once."""
    bugs = manifest["bugs"][:opts.max_tasks]
    if bugs:
        out.mkdir(parents=True, exist_ok=True)
    tasks = [taskdir.write(pkg, bug, out, manifest["test_timeout"]) for bug in bugs]
    if not opts.check:
        return tasks, []
    digest = verify.judge_digest() if opts.checker is not None else None
    env = verify.env_digest(manifest)
    todo = [i for i, bug in enumerate(bugs) if not _stands(bug, digest, env, i < opts.redteam)]
    if len(todo) < len(bugs):
        opts.log(f"{pkg.key}: {len(bugs) - len(todo)} of {len(bugs)} tasks hold a check under today's judge "
                 f"({digest}) and env lock ({env}); checking {len(todo)}")
    bar = tqdm(total=len(todo), desc=f"check {pkg.key}", unit="task", file=sys.stderr, disable=len(todo) < 2)
    with bar, ThreadPoolExecutor(max(1, opts.jobs)) as pool:  # each check runs its own event loop
        verdicts = pool.map(lambda i: (i, verify.check_task(tasks[i], opts.checker, i < opts.redteam)), todo)
        dropped = []
        for i, verdict in verdicts:
            if not _keep(tasks[i], bugs[i], verdict, opts, manifest, save):
                dropped.append(tasks[i].name)
            bar.update()
    return [t for t in tasks if t.name not in dropped], dropped


def _stands(bug: dict, digest: str | None, env: str, redteam: bool) -> bool:
    """Does a bug's check record spare it a new check? Only one made by today's judge in the
    env the manifest locks."""
    if digest is None or not verify.passed_under(bug, digest, env):
        return False
    return bool(bug["checked"].get("tier2")) or not redteam


def _keep(task: Path, bug: dict, verdict: tuple, opts: Options, manifest: dict, save) -> bool:
    ok, why, record = verdict
    if not ok:
        opts.log(f"{task.name}: dropped: {why}")
        shutil.rmtree(task, ignore_errors=True)
        return False
    if record is not None:  # kept in the manifest: which judge's check it passed, in which env, when
        bug["checked"] = {**record, "env": verify.env_digest(manifest)}
        if save is not None:
            save(manifest)
    return True


@contextlib.contextmanager
def manifest_lock(path: Path, log=print):
    """Held while one make hunts, checks and writes the manifest at `path`: two makes of a package
    at once (a second terminal, a red-team sample beside a long check) would each write back
    their own copy and lose the other's check records. The lock file lies in the cache, not
    beside the committed manifests."""
    locks = package.cache_root() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16] + ".lock"
    with open(locks / name, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"{path.name}: another wharf tasks make holds it; waiting")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def load_manifest(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if data.get("manifest") == MANIFEST_VERSION else None


def manifest_name(pkg_name: str, version: str, seed: int) -> str:
    return f"{pkg_name.lower()}-{version}.seed{seed}.json"


