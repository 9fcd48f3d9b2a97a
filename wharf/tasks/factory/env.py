"""The test environment of a package version: a venv, made once, with pytest and what the
package's tests need (its runtime requirements, its test extras or dependency groups, its test
requirements files, and the extra deps its line in packages.txt names). The package itself is not
installed: the tests import it from the workspace.

Its lock (`freeze`: every distribution in it, `name==version`) is kept in the package's manifest
(`env`), and an env made for a manifest that has one installs exactly that (`build_env(pins=)`):
a task set made on another machine or a year later runs in the env its checks ran in, not in
whatever the index resolves to that day."""
from __future__ import annotations

import email.parser
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from .package import JUNK, TESTY_EXTRA, FactoryError, Package, _canon

def _wharf_pytest() -> str:
    """The pytest of wharf's own venv, where the judge (pytest_decide.py) is tested."""
    try:
        return f"pytest=={importlib.metadata.version('pytest')}"
    except importlib.metadata.PackageNotFoundError:  # the judge needs it too: say so when it is used
        return "pytest"


PYTEST = _wharf_pytest()
ENV_MARKERS = {"python_version": f"{sys.version_info[0]}.{sys.version_info[1]}", "sys_platform": "linux",
               "platform_system": "Linux", "implementation_name": "cpython", "os_name": "posix",
               "platform_python_implementation": "CPython",
               "python_full_version": ".".join(map(str, sys.version_info[:3]))}


def _names(lines: list[str], extras: list[str] | None = None) -> list[str]:
    """Requirement strings that apply here (markers evaluated for one of `extras`, or none)."""
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for line in lines:
        line = line.split(" #")[0].strip()
        if not line or line.startswith(("#", "-", ".", "/")) or "://" in line:
            continue
        try:
            r = Requirement(line)
        except InvalidRequirement:
            continue
        if r.marker and not any(_marker_ok(r.marker, e) for e in (extras or [""])):
            continue
        r.marker = None
        out.append(str(r))
    return out


def _marker_ok(marker, extra: str) -> bool:
    try:
        return marker.evaluate({**ENV_MARKERS, "extra": extra})
    except Exception:  # noqa: BLE001 - an odd marker: leave the requirement out
        return False


def declared_deps(root: Path) -> list[str]:
    """Runtime and test requirements the sdist declares, without the tools a test run does not need."""
    deps: list[str] = []
    info = root / "PKG-INFO"
    meta = email.parser.Parser().parsestr(info.read_text(errors="replace")) if info.exists() else None
    reqs = (meta.get_all("Requires-Dist") if meta else None) or []
    pyproject = _toml(root / "pyproject.toml")
    if not reqs:
        proj = pyproject.get("project", {})
        reqs = list(proj.get("dependencies", []))
        for extra, items in proj.get("optional-dependencies", {}).items():
            reqs += [f"{i} ; extra == '{extra}'" for i in items]
    extras = [e for e in ((meta.get_all("Provides-Extra") if meta else None) or
                          pyproject.get("project", {}).get("optional-dependencies", {})) if TESTY_EXTRA.match(e)]
    deps += _names([r for r in reqs if "extra" not in r])
    deps += _names([r for r in reqs if "extra" in r], extras) if extras else []
    groups = pyproject.get("dependency-groups", {})
    for g in [g for g in groups if TESTY_EXTRA.match(g)]:
        deps += _names([i for i in groups[g] if isinstance(i, str)])
    for f in sorted({*root.glob("requirements*test*.txt"), *root.glob("test*requirements*.txt"),
                     *root.glob("requirements/test*.txt"), *root.glob("tests/requirements*.txt")}):
        deps += _names([s for s in f.read_text(errors="replace").splitlines() if not s.strip().startswith("-")])
    own = _canon(meta.get("Name") if meta and meta.get("Name") else root.name.rsplit("-", 1)[0])
    keep = []
    for d in dict.fromkeys(deps):
        n = _canon(re.split(r"[\s\[<>=!~;@]", d)[0])
        if n and n != own and not JUNK.match(n):
            keep.append(d)
    return keep


def _toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text()) if path.exists() else {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return {}


def write_metadata(pkg: Package, env: Path) -> None:
    """The package's own dist-info (its PKG-INFO as METADATA), without its code: suites that ask
    importlib.metadata for their package's version find it, and the code still comes from the
    workspace."""
    info = pkg.root / "PKG-INFO"
    site = next((env / "lib").glob("python3*/site-packages"), None)
    if not info.exists() or site is None:
        return
    dist = site / f"{re.sub(r'[^A-Za-z0-9.]+', '_', pkg.name)}-{pkg.version}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_bytes(info.read_bytes())
    (dist / "INSTALLER").write_text("wharf-tasks-make\n")


def build_env(pkg: Package, log, pins: list[str] | None = None) -> Path:
    """pkg.env, made once. With `pins` (a manifest's lock) exactly those, and an env in the cache
    that differs from them is made again; without, pytest + the declared and extra deps, a
    declared dep that does not install dropped (the suite decides whether it mattered)."""
    wanted = _with_our_pytest(pins) if pins else None
    if pkg.python.exists():
        pkg.env.chmod(0o755)  # the sandbox's uids must reach it (an env made by an older wharf was 0700)
        write_metadata(pkg, pkg.env)
        _ensure_pytest(pkg.python, log)
        if wanted is None or freeze(pkg) == wanted:
            return pkg.env
        log(f"{pkg.key}: its env differs from the manifest's lock (`env`): made again from the lock")
    _build_aside(pkg, wanted, log)
    return pkg.env


def _build_aside(pkg: Package, wanted: list[str] | None, log) -> None:
    """Built in a temp dir beside pkg.env, then renamed over it: a build that fails leaves the env as it was."""
    pkg.env.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{pkg.key}.", dir=pkg.env.parent))
    try:
        # The same base interpreter as wharf's venv: the sandbox shows that one to every trial.
        # With uv the deps go in through it: the venv needs no pip of its own (ensurepip is slow).
        subprocess.run([sys._base_executable, "-m", "venv", *(["--without-pip"] if _uv() else []), str(tmp)],
                       check=True, capture_output=True)
        py = tmp / "bin" / "python"
        if wanted is None:
            _resolve(pkg, py, log)
        elif not _install(py, ["--no-deps", *wanted], log):
            raise FactoryError(f"{pkg.name}=={pkg.version}: the env its manifest locks (`env`) does not install; "
                               "remove the manifest's `env` to resolve its deps anew")
        if not _ensure_pytest(py, log):
            raise FactoryError(f"{pkg.name}=={pkg.version}: {PYTEST} does not install into its environment")
        write_metadata(pkg, tmp)
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide it from the sandbox's uids
        stale = pkg.env.rename(tmp.with_name(tmp.name + ".stale")) if pkg.env.exists() else None
        tmp.rename(pkg.env)
        # A venv's scripts name its own path: made aside, it was moved, so rebuild them in place.
        subprocess.run([sys._base_executable, "-m", "venv", "--upgrade", str(pkg.env)], capture_output=True)
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _resolve(pkg: Package, py: Path, log) -> None:
    deps = [d for d in [*declared_deps(pkg.root), *pkg.extra_deps] if _canon(re.split(r"[\s\[<>=!~;@]", d)[0]) != "pytest"]
    if not _install(py, [PYTEST, *deps], log):
        for dep in deps:
            _install(py, [dep], log)


def freeze(pkg: Package) -> list[str]:
    """The env's lock: `name==version` of every distribution in it (names canonical, sorted), but
    the package's own metadata and pip (a venv's installer, not the tests')."""
    r = subprocess.run([str(pkg.python), "-I", "-c", "import importlib.metadata as m\n"
                        "for d in m.distributions(): print(d.metadata['Name'], d.version)"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode:
        raise FactoryError(f"{pkg.key}: cannot list its env's packages ({r.stderr.strip()[-200:]})")
    skip = {_canon(pkg.name), "pip"}
    lines = {f"{_canon(n)}=={v}" for n, v in (line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)}
    return sorted(line for line in lines if line.split("==")[0] not in skip)


def _with_our_pytest(pins: list[str]) -> list[str]:
    """A lock's pytest is wharf's own (the judge reads pytest's internals of that version)."""
    if "==" not in PYTEST:  # wharf's own pytest unknown: the lock as it is
        return pins
    return sorted([p for p in pins if p.split("==")[0] != "pytest"] + [PYTEST])


def _uv() -> str | None:
    """uv beside this interpreter (the project venv's: make setup installs it there), else on PATH."""
    here = Path(sys.executable).parent / "uv"
    return str(here) if here.exists() else shutil.which("uv")


def _ensure_pytest(py: Path, log) -> bool:
    """The env's pytest is wharf's own version (installed again when a dep moved it): the judge
    reads pytest's internals, which it knows for that version."""
    def version() -> str:
        r = subprocess.run([str(py), "-c", "import importlib.metadata as m; print(m.version('pytest'))"],
                           capture_output=True, text=True)
        return r.stdout.strip()
    want = PYTEST.partition("==")[2]
    return (version() or "-") == (want or version() or "-") or (_install(py, [PYTEST], log) and bool(version()))


def _install(py: Path, reqs: list[str], log) -> bool:
    uv = _uv()
    cmd = [uv, "pip", "install", "-q", "--python", str(py), *reqs] if uv else \
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *reqs]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode:  # said: a declared dep that does not install is left out of the env
        log(f"install {' '.join(reqs)}: exit {r.returncode} {r.stderr.strip()[-300:]}")
    return r.returncode == 0
