"""Compile one of wharf's C files (wharf/core/cpu_linear.c, wharf/engine/cpu_race.c, wharf/engine/cpu_layer.c with
the first) once per machine into a cache.

`cc -march=native` code runs only on CPUs like the one that built it, so a build is keyed by the
source, the flags and the CPU's model and feature flags; it is made in a temporary folder and
renamed into place, so a crash or a second engine never sees half a library.
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]


def cpu_id() -> str:
    """What -march=native compiles for: the CPU's model name and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return "\n".join(sorted({l for l in lines if l.startswith(("model name", "flags"))}))


def build(source: Path, cache: Path, flags: list[str] = FLAGS, also: tuple[Path, ...] = ()) -> Path:
    """The compiled `source` (linked with the sources `also`) for this CPU and flags, built into
    `cache` if not there yet; OSError (with the compiler's message) where it cannot be."""
    texts = [p.read_text() for p in (source, *also)]
    key = hashlib.sha256("\0".join([*texts, *flags, cpu_id()]).encode()).hexdigest()[:16]
    lib = cache / f"{source.stem}-{key}.so"
    if not lib.exists():
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            raise OSError("no C compiler (cc) on PATH")
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            out = Path(tmp) / lib.name
            cmd = [cc, *flags, str(source), *map(str, also), "-o", str(out)]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise OSError(f"{cc} failed on {source}: {r.stderr.strip()[-500:]}")
            os.replace(out, lib)
    return lib
