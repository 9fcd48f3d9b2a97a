"""The one entry idiom of every wharf command (`wharf <command>`, and the `python -m` forms).

1. `launch` applies the process env defaults *before* the command's module loads (torch reads
   OMP_WAIT_POLICY, huggingface_hub HF_HUB_OFFLINE, at import), then runs its `main(argv, prog)`.
2. A command parses `--config FILE key=value ...` (wharf.config.cli_config; `--help` lists every
   key with its default; a bad config is one line and exit 2),
3. and runs its body under `guarded`: one logging style (wharf.log), and any WharfError printed
   as one line, `<prog>: <message>`, with exit 1. Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import importlib
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
        return 1
