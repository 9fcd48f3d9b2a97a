"""The one entry idiom of every wharf command (`wharf <command>`, and the `python -m` forms).

1. `launch` applies the process env defaults *before* the command's module loads (torch reads
   OMP_WAIT_POLICY, huggingface_hub HF_HUB_OFFLINE, at import), then runs its `main(argv, prog)`.
2. A command parses `--config FILE key=value ...` (wharf.config.cli_config; `--help` lists the
   keys it reads with their defaults; a bad config is one line and exit 2),
3. and runs its body under `guarded`: one logging style (wharf.log), and any WharfError printed
   as one line, `<prog>: <message>`, with its exit code (1; 2 for a UsageError or a bad config).
   Anything else is a bug and keeps its traceback.
Commands that take arguments of their own build them with `ArgParser`: an argument error is one
line too (`<prog>: <message> (see <prog> --help)`), exit 2.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
from typing import Callable

from wharf.core import envdefaults, storage
from wharf.core.errors import WharfError
from wharf.core.log import setup_logging


def launch(module: str, prog: str, argv: list[str] | None = None) -> int:
    """Run `module.main(argv, prog)` with the env defaults applied first."""
    envdefaults.apply()
    return importlib.import_module(module).main(argv, prog)


def guarded(prog: str, body: Callable[[], int | None]) -> int:
    """`body()` with our logging; a WharfError is one line on stderr and exit status 1."""
    setup_logging()
    try:
        with storage.urls_in_errors():  # a run in object storage is named by its URL, not its local mirror
            return body() or 0
    except WharfError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return e.exit_code


class ArgParser(argparse.ArgumentParser):
    """argparse, with an argument error as one line naming the command and where help is, exit 2
    (argparse's own prints the whole usage first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def quiet_broken_pipe(main: Callable[..., int]) -> Callable[..., int]:
    """`wharf --help | head`: the reader leaving early is not an error (no BrokenPipeError
    traceback); stdout goes to /dev/null so that the flush at exit does not raise again."""
    @functools.wraps(main)
    def wrapped(*args, **kwargs) -> int:
        try:
            try:
                return main(*args, **kwargs)
            finally:
                sys.stdout.flush()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141  # what a shell reports for a writer stopped by SIGPIPE
    return wrapped
