"""One model call as an agent logged it: what every agent-log reader (logs.py, opencode_db.py,
gemini_session.py) makes, and the JSONL reading they share."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


@dataclass
class AgentCall:
    """One model call as the agent logged it; None where its log does not say."""

    text: str | None = None  # the assistant text it received
    response_ids: set[str] = field(default_factory=set)  # ids of the answer (or of its items)
    prompt_tokens: int | None = None  # the prompt length the answer reported
    # what the agent kept of the answer's text, when not all of it (opencode's title: its first line)
    derive: Callable[[str], str] | None = None


def item_call(item_id: str) -> str | None:
    """The proxy's Responses item ids are <kind>_<call suffix>_<index>: the suffix names the call."""
    kind, _, rest = item_id.partition("_")
    sfx, _, idx = rest.rpartition("_")
    return sfx if kind in ("msg", "fc", "ctc") and sfx and idx.isdigit() else None


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a JSONL log, skipping any other line."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # the CLI's own stderr lines share the file
    return out
