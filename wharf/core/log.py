"""The one logging set-up of every wharf command."""
from __future__ import annotations

import logging

_QUIET = ("harbor", "httpx", "LiteLLM")  # harbor keeps its DEBUG in each trial's own trial.log


def setup_logging(level: int = logging.INFO) -> None:
    """Our INFO on the console, `HH:MM:SS LEVEL logger: message`; harbor and HTTP clients only from
    WARNING. Idempotent: a second call (a command run in-process twice) adds no second handler."""
    root = logging.getLogger()
    if any(getattr(h, "_wharf", False) for h in root.handlers):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    handler.addFilter(lambda r: r.levelno >= logging.WARNING or not r.name.startswith(_QUIET))
    handler._wharf = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
