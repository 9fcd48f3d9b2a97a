"""What the factory's tests share: a package's sdist put in a cache of the test's own and its env
as `wharf tasks make` builds it but offline (a venv that sees this venv's pytest), and the CLI's
exit code with its stderr lines. tinycalc-0.1 is the bundled small package."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

from wharf.tasks.factory import cli

FIXTURE = Path(__file__).parent / "fixtures" / "factory" / "tinycalc-0.1"


def run_cli(args: list[str], capsys) -> tuple[int, list[str]]:
    code = cli.main(args)
    return code, capsys.readouterr().err.strip().splitlines()


def put_sdist(cache: Path, src: Path, name: str) -> None:
    """src packed as the cache's sdist `name`-0.1.tar.gz (what `pip download` would have put there)."""
    sdists = cache / "tasks" / "sdists"
    sdists.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdists / f"{name}-0.1.tar.gz", "w:gz") as t:
        t.add(src, arcname=f"{name}-0.1")


def offline_env(cache: Path, key: str) -> None:
    """The package's env as `make` builds it, but offline: a venv that sees this venv's pytest."""
    env = cache / "tasks" / "envs" / key
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = next((env / "lib").glob("python3*/site-packages"))
    # its real path: a sandbox shows the venv at its real path only (.venv may be a link)
    (site / "wharf_host.pth").write_text(os.path.realpath(sysconfig.get_paths()["purelib"]) + "\n")
    env.chmod(0o755)


def tinycalc_cache(tmp_path: Path, monkeypatch, src: Path = FIXTURE) -> Path:
    """A cache of its own holding tinycalc's sdist (packed from `src`) and its offline env; the out dir."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("WHARF_CACHE", str(cache))
    put_sdist(cache, src, "tinycalc")
    offline_env(cache, "tinycalc-0.1")
    return tmp_path / "out"
