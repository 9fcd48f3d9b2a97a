"""What a wharf install carries besides its code, and where its caches go.

wharf/data/ holds the default configs (data/configs/*.yaml) and the bundled demo tasks
(data/datasets/toy). In a checkout these are links to configs/ and datasets/toy, so the repo paths
stay the ones to edit; a built wheel carries copies. A relative path in a config or on the
command line is read from the current directory first, as always; only when nothing is there and
wharf carries that path (`configs/default.yaml`, `datasets/toy`) is the carried copy used, said
once in the log by the stage that reads it (a refused command says only why). So `wharf collect` runs on the bundled tasks from any directory.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # wharf/
DATA = PACKAGE_DIR / "data"
# The directory that holds the package: a checkout's root, or site-packages in an install. Child
# processes (`python -m wharf.engine`) start there, so they import this same copy of wharf.
PACKAGE_PARENT = PACKAGE_DIR.parent

_said: dict[str, str] = {}  # a carried copy resolve returned -> the note saying so


def checkout_root() -> Path | None:
    """The checkout this wharf runs from (its pyproject.toml beside the package); None in an install."""
    return PACKAGE_PARENT if (PACKAGE_PARENT / "pyproject.toml").is_file() else None


def cache_dir() -> Path:
    """$WHARF_CACHE; else a checkout's own .cache/wharf (as before there were wheels); else the
    user's cache dir ($XDG_CACHE_HOME/wharf, ~/.cache/wharf): never inside site-packages."""
    if os.environ.get("WHARF_CACHE"):
        return Path(os.environ["WHARF_CACHE"])
    root = checkout_root()
    if root is not None:
        return root / ".cache" / "wharf"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "wharf"


def carried(path: str) -> Path | None:
    """The copy wharf carries of the relative `path` (e.g. datasets/toy), or None."""
    p = Path(path)
    if p.is_absolute() or ".." in p.parts:
        return None
    there = DATA / p
    return there.resolve() if there.exists() else None


def resolve(path: str, key: str) -> str:
    """`path` as given when it exists (or is absolute, or a URL); else wharf's carried copy of it
    when there is one (logged once per path); else `path` unchanged, for the reader's own error."""
    if "://" in path or Path(path).is_absolute() or Path(path).exists():
        return path
    there = carried(path)
    if there is None:
        return path
    if str(there) not in _said:  # said by the stage that reads it (carried_note), not at every config load
        _said[str(there)] = f"{key}={path}: not under {os.getcwd()}, using the copy wharf carries ({there})"
        logging.getLogger("wharf").debug("%s", _said[str(there)])
    return str(there)


def carried_note(resolved: str) -> str | None:
    """The line saying that `resolved` (a value `resolve` returned) is wharf's carried copy; None
    when it is the path as given."""
    return _said.get(resolved)


def config_path(path: str | Path) -> Path:
    """A config file as named: a path, else the carried configs/<name> (`--config configs/default.yaml`
    from any directory), or a carried config's bare name (`--config default`)."""
    text = str(path)
    if Path(text).exists():
        return Path(text)
    # a bare name (default, default.yaml) is looked up under configs/ only
    for candidate in ([text] if "/" in text else [f"configs/{text}", f"configs/{text}.yaml"]):
        there = carried(candidate)
        if there is not None and there.is_file():
            return Path(resolve(candidate, "--config"))
    return Path(text)


def carried_configs() -> list[str]:
    """The names of the configs wharf carries (for a message that lists them)."""
    return sorted(p.stem for p in (DATA / "configs").glob("*.yaml"))
