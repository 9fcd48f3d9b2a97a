"""One model call as an agent logged it: what every agent-log reader (logs.py, opencode_db.py) makes."""
from __future__ import annotations

from dataclasses import dataclass, field
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
