"""What a checker (a task's tests/check.py) sees of the workspace: a read-only view.

Standalone, stdlib only. Paths are relative to the workspace; one that resolves outside it (a
symlink the agent planted) is refused, and only regular files are read (a FIFO would hang the
grader), at most MAX_READ bytes. `call` and `value` run the code under test in a separate,
fresh interpreter (judge_calls.py) and bring back plain data: the checker never imports it.
"""
from __future__ import annotations

import os
import stat

import judge_calls

MAX_READ = 1 << 20


class CallFailed(AssertionError):
    """The code under test raised, hung, or answered something that is not plain data."""


class State:
    def __init__(self, workdir: str, python: str, timeout: float):
        self._root = os.path.realpath(workdir)
        self._python, self._timeout = python, timeout

    def _path(self, rel: str) -> str:
        path = os.path.realpath(os.path.join(self._root, rel))
        if path != self._root and not path.startswith(self._root + os.sep):
            raise PermissionError(f"{rel}: outside the workspace")
        return path

    def exists(self, rel: str) -> bool:
        try:
            return os.path.exists(self._path(rel))
        except PermissionError:
            return False

    def is_dir(self, rel: str) -> bool:
        return self.exists(rel) and os.path.isdir(self._path(rel))

    def is_file(self, rel: str) -> bool:
        return self.exists(rel) and os.path.isfile(self._path(rel))

    def read_bytes(self, rel: str) -> bytes:
        fd = os.open(self._path(rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise IsADirectoryError(f"{rel}: not a regular file")
            data = os.read(fd, MAX_READ + 1)
        finally:
            os.close(fd)
        if len(data) > MAX_READ:
            raise ValueError(f"{rel}: larger than {MAX_READ} bytes")
        return data

    def read_text(self, rel: str) -> str:
        return self.read_bytes(rel).decode("utf-8")

    def call(self, module: str, name: str, *args):
        """module.name(*args), run in its own process: the answer as plain data."""
        return self._one(module, name, list(args))

    def value(self, module: str, name: str):
        """module.name, read in its own process: the value as plain data."""
        return self._one(module, name, None)

    def _one(self, module: str, name: str, args):
        run = judge_calls.run_batch(self._python, self._root, [(module, name, args)], self._timeout)
        answer = run["answers"][0]
        if run["survivors"]:
            raise CallFailed(f"{module}.{name}: {run['survivors']}")
        if "error" in answer:
            raise CallFailed(f"{module}.{name}: {answer['error']}" + (" (timed out)" if run["timed_out"] else ""))
        return answer["value"]
