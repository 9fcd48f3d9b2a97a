"""The one logging set-up of every wharf command."""
from __future__ import annotations

import logging
import sys

_QUIET = ("harbor", "httpx", "LiteLLM")  # harbor keeps its DEBUG in each trial's own trial.log


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is when it writes: a command run in-process again (a notebook,
    a test's capture) after the stream it first saw was closed still logs."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ sets it: the property decides
        pass


def setup_logging(level: int = logging.INFO) -> None:
    """Our INFO on the console, `HH:MM:SS LEVEL logger: message`; harbor and HTTP clients only from
    WARNING. Idempotent: a second call (a command run in-process twice) adds no second handler."""
    root = logging.getLogger()
    if any(getattr(h, "_wharf", False) for h in root.handlers):
        return
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    handler.addFilter(lambda r: r.levelno >= logging.WARNING or not r.name.startswith(_QUIET))
    handler._wharf = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
