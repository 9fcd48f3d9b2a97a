"""gemini-cli's own record of its model calls: its session file (harbor copies the newest one
from ~/.gemini/tmp/*/chats/ to the trial's agent/gemini-cli.trajectory.jsonl), read for
logs.py's "rows = agent log" check.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from wharf.collect.agents.calls import AgentCall, read_jsonl


_ZERO_WIDTH = re.compile("[\u200b-\u200d\ufeff\u200e\u200f]")
_HTML_COMMENT = re.compile(r"<!--[\s\S]*?-->")


def _gemini_kept(text: str) -> str:
    """What gemini-cli keeps of an answer's text: no zero-width characters, no HTML comments, trimmed."""
    text, prev = _ZERO_WIDTH.sub("", text), None
    while prev != text:
        prev, text = text, _HTML_COMMENT.sub("", text)
    return text.strip()


def read_session(path: Path) -> list[AgentCall]:
    """The session's messages: a whole {messages: [...]} file, or a JSONL journal of records (a
    message by id, written again when it changes) and `$set` records that replace the list."""
    if path.suffix == ".json":
        messages = json.loads(path.read_text()).get("messages") or []
    else:
        by_id: dict[str, dict] = {}
        for e in read_jsonl(path):
            if isinstance((e.get("$set") or {}).get("messages"), list):
                by_id = {m.get("id"): m for m in e["$set"]["messages"]}
            elif e.get("id") and e.get("type"):
                by_id[e["id"]] = e  # dicts keep the first position: a rewrite stays in place
        messages = list(by_id.values())
    return [AgentCall(text=m["content"] if isinstance(m.get("content"), str) else None,
                      prompt_tokens=(m.get("tokens") or {}).get("input"), derive=_gemini_kept)
            for m in messages if m.get("type") == "gemini"]
