"""The tree each pytest run sees: a fresh copy of the agent's workspace with the pristine test
files put in, made anew for every run, so no run (and no file the agent planted) prepares another.

Standalone (stdlib only), used by pytest_grade.py. The test files are read into memory once,
before any test runs (the tests' own code could rewrite them later); each run gets
`merged_copy(workdir, tests)`, and jail.py binds the copy at the workspace's path with the test
files read-only over it. The agent's workspace itself is never shown to the code under test.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile


class TreeError(Exception):
    """The workspace or a test file cannot be read or copied (an infrastructure fault)."""


def read_tests(tests_dir: str, files: list[str]) -> dict[str, bytes]:
    """{relative path: bytes} of each test file under tests_dir, read now."""
    out = {}
    for rel in files:
        if os.path.isabs(rel) or ".." in rel.split("/"):
            raise TreeError(f"--test-file {rel!r}: give a path relative to the workspace, without '..'")
        try:
            with open(os.path.join(tests_dir, rel), "rb") as f:
                out[rel] = f.read()
        except OSError as e:
            raise TreeError(f"--test-file {rel!r}: cannot read it in {tests_dir}: {e.strerror}") from e
    return out


def _clear_way(root: str, rel: str) -> None:
    """Make every parent of root/rel a real directory of the copy (not a symlink that leads out
    of it, not a file) and remove whatever is at root/rel."""
    here = root
    for part in rel.split("/")[:-1]:
        here = os.path.join(here, part)
        if os.path.islink(here) or (os.path.exists(here) and not os.path.isdir(here)):
            os.unlink(here)
        os.makedirs(here, exist_ok=True)
    target = os.path.join(root, rel)
    if os.path.isdir(target) and not os.path.islink(target):
        shutil.rmtree(target)
    elif os.path.lexists(target):
        os.unlink(target)


def merged_copy(workdir: str, tests: dict[str, bytes], timeout: float = 600.0) -> str:
    """A new directory holding a copy of workdir (symlinks, modes and special files as they
    are: `cp -a`) with the pristine test files written in, read-only. The caller removes it."""
    dest = tempfile.mkdtemp(prefix="wharf-tree-")
    try:
        subprocess.run(["cp", "-a", "--", os.path.join(workdir, "."), dest], check=True, capture_output=True,
                       timeout=timeout)
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        remove(dest)
        why = getattr(e, "stderr", b"") or str(e).encode()
        raise TreeError(f"cannot copy the workspace {workdir}: {why.decode('utf-8', 'replace').strip()[:300]}") from e
    for rel, data in tests.items():
        _clear_way(dest, rel)
        with open(os.path.join(dest, rel), "xb") as f:
            f.write(data)
        os.chmod(os.path.join(dest, rel), 0o444)
    return dest


def remove(path: str) -> None:
    """Remove a copy, whatever modes the code under test left in it."""
    subprocess.run(["chmod", "-R", "u+rwX", "--", path], capture_output=True)
    shutil.rmtree(path, ignore_errors=True)
