"""A package version's source and test environment, each made once into the cache.

    $WHARF_CACHE/tasks/sdists/   the sdists as the package index serves them
    $WHARF_CACHE/tasks/src/NAME-VERSION/   the sdist unpacked (read-only use: tasks copy it)
    $WHARF_CACHE/tasks/envs/NAME-VERSION/  a venv with pytest and the test dependencies, not the
        package itself: tests import it from the workspace (pytest's pythonpath), so a task's
        buggy source is what runs. Trials see it read-only (task.toml's wharf_expose).
Nothing here is needed at trial time but the env and the task dir.
"""
from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from wharf.core.model_store import cache_dir

SPEC = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:==([A-Za-z0-9.+!_-]+))?$")
TEST_DIRS = ("tests", "test", "testing", "t")
NOT_PACKAGES = {"tests", "test", "testing", "docs", "doc", "examples", "example", "benchmarks", "bench",
                "scripts", "tools", "build", "dist", "ci", "bin", "requirements"}
# Test extras' tools that a test run does not need (and that often fail to install or slow it).
JUNK = re.compile(r"^(coverage|pytest-cov|codecov|coveralls|tox|tox-.*|nox|flake8.*|mypy|pyright|sphinx.*|black|"
                  r"ruff|pre-commit|prek|twine|build|check-manifest|pylint|isort|wheel|setuptools|pip|"
                  r"pytest-(mypy.*|flake8|pylint|black|ruff|isort|checkdocs|enabler|sugar|randomly|xdist|"
                  r"instafail|clarity|timeout|codspeed|benchmark|perf|cov)|types-.*|docutils|"
                  r"setuptools-scm|hatch.*|flit.*|pyupgrade|bandit|mkdocs.*|covdefaults|codespell)$", re.I)
TESTY_EXTRA = re.compile(r"^(test|tests|testing|test[-_].+|.+[-_]tests?)$", re.I)


class FactoryError(Exception):
    """Why a package cannot give tasks: one line for the user (exit 2 in the CLI)."""


@dataclass
class Package:
    name: str
    version: str
    root: Path  # the unpacked sdist
    pyroot: str  # where the importable code lies, relative to root ("." or "src")
    test_paths: list[str]  # test dirs or files, relative to root
    extra_deps: list[str] = field(default_factory=list)
    pytest_args: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"

    @property
    def env(self) -> Path:
        return cache_root() / "envs" / self.key

    @property
    def python(self) -> Path:
        return self.env / "bin" / "python"


def cache_root() -> Path:
    return cache_dir() / "tasks"


def parse_spec(text: str) -> tuple[str, str | None]:
    m = SPEC.match(text.strip())
    if not m:
        raise FactoryError(f"{text!r}: not a package spec (NAME or NAME==VERSION)")
    return m.group(1), m.group(2)


def _pip() -> list[str]:
    return [sys.executable, "-m", "pip"]


def fetch_sdist(name: str, version: str | None) -> Path:
    """The sdist of name[==version], downloaded into the cache once (a pinned one found there is
    used as it is, without asking the index)."""
    sdists = cache_root() / "sdists"
    sdists.mkdir(parents=True, exist_ok=True)
    if version:
        found = _cached_sdist(sdists, name, version)
        if found:
            return found
    spec = f"{name}=={version}" if version else name
    with tempfile.TemporaryDirectory(dir=sdists) as tmp:
        r = subprocess.run([*_pip(), "download", "-q", "--no-deps", "--no-binary", ":all:",
                            "-d", tmp, spec], capture_output=True, text=True, timeout=600)
        got = sorted(Path(tmp).iterdir())
        if r.returncode != 0 or not got:
            why = (r.stderr.strip().splitlines() or ["no sdist"])[-1]
            raise FactoryError(f"{spec}: no source distribution on the package index ({why[:200]})")
        final = sdists / got[0].name
        got[0].replace(final)
    return final


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _cached_sdist(sdists: Path, name: str, version: str) -> Path | None:
    for p in sorted(sdists.iterdir()):
        stem = re.sub(r"(\.tar\.gz|\.zip|\.tar\.bz2)$", "", p.name)
        if "-" in stem and _canon(stem.rsplit("-", 1)[0]) == _canon(name) and stem.rsplit("-", 1)[1] == version:
            return p
    return None


def unpack(archive: Path) -> Path:
    """The sdist unpacked under the cache's src/ (once; a half-made one is never left)."""
    src = cache_root() / "src"
    src.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=src) as tmp:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                z.extractall(tmp)
        else:
            with tarfile.open(archive) as t:
                t.extractall(tmp, filter="data")
        tops = list(Path(tmp).iterdir())
        if len(tops) != 1 or not tops[0].is_dir():
            raise FactoryError(f"{archive.name}: not one top directory in the sdist")
        final = src / tops[0].name
        if not final.exists():
            tops[0].rename(final)
    return final


def version_of(root: Path) -> str:
    info = root / "PKG-INFO"
    if info.exists():
        v = email.parser.Parser().parsestr(info.read_text(errors="replace")).get("Version")
        if v:
            return v
    return root.name.rsplit("-", 1)[-1]


def find_layout(root: Path) -> tuple[str, list[str]]:
    """(pyroot, test paths): src/ when there is one, and the conventional test dirs (at the top,
    in src/, or in a package) or files."""
    pyroot = "src" if (root / "src").is_dir() else "."
    base = root / pyroot
    tests = [t for t in TEST_DIRS if (root / t).is_dir() and any((root / t).rglob("test*.py"))]
    if not tests and pyroot != ".":  # src/tests beside the package (configobj)
        tests = [f"{pyroot}/{t}" for t in TEST_DIRS if (base / t).is_dir() and any((base / t).rglob("test*.py"))]
    if not tests:
        for p in sorted(base.iterdir()):
            if p.is_dir() and (p / "__init__.py").exists() and p.name not in NOT_PACKAGES:
                tests += [str(d.relative_to(root)) for t in ("tests", "test") if (d := p / t).is_dir()]
    if not tests:
        tests = [p.name for p in sorted(root.glob("test*.py"))] + [p.name for p in sorted(root.glob("*_test.py"))]
    return pyroot, tests
