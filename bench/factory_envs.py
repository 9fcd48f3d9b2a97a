"""A package version's test env made three ways, side by side: pip resolving the sdist's declared
deps (what the factory did wherever uv was not on PATH), uv resolving them, and uv installing the
manifest's lock (`env`, --no-deps: what a make does now). Wall seconds of each and the ratio to
pip, then whether the two uv envs hold what the lock says. Each build starts from no env; the
sdists are fetched once beforehand, and pip's and uv's download caches are as this machine has
them (warm after a first run, for both).

    python bench/factory_envs.py [MANIFEST...]   (default: jinja2, attrs and marshmallow of datasets/real)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from wharf.tasks.factory import env as envs
from wharf.tasks.factory import make

REPO = Path(__file__).resolve().parents[1]
DEFAULT = ["jinja2-3.1.6", "attrs-26.1.0", "marshmallow-4.4.0"]


def _build(pkg, pins, uv: bool) -> float:
    shutil.rmtree(pkg.env, ignore_errors=True)
    real_uv = envs._uv
    envs._uv = real_uv if uv else (lambda: None)
    try:
        t0 = time.monotonic()
        envs._build_aside(pkg, envs._with_our_pytest(pins) if pins else None, lambda s: print("  " + s[:160]))
        return time.monotonic() - t0
    finally:
        envs._uv = real_uv


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("manifests", nargs="*", type=Path)
    paths = ap.parse_args().manifests or [REPO / "datasets/real/manifests" / f"{k}.seed0.json" for k in DEFAULT]
    os.environ["WHARF_CACHE"] = tempfile.mkdtemp(prefix="wharf-bench-envs-")
    print(f"{'package':<24} {'pip resolve':>11} {'uv resolve':>10} {'uv lock':>8} {'pip/lock':>8}  lock matches")
    try:
        for path in paths:
            m = json.loads(path.read_text())
            pkg = make.fetch(make.Entry(f"{m['package']}=={m['version']}", list(m.get("deps", [])), list(m.get("args", []))))
            pip = _build(pkg, None, uv=False)
            uv = _build(pkg, None, uv=True)
            resolved = envs.freeze(pkg)
            lock = _build(pkg, m["env"], uv=True)
            same = envs.freeze(pkg) == m["env"]
            print(f"{pkg.key:<24} {pip:>10.1f}s {uv:>9.1f}s {lock:>7.1f}s {pip / lock:>7.1f}x  "
                  f"{'yes' if same else 'NO'} (uv resolve {'agrees' if resolved == m['env'] else 'differs'})",
                  flush=True)
    finally:
        shutil.rmtree(os.environ["WHARF_CACHE"], ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
