"""opencode's record of its model calls, read from its session database (opencode.db, SQLite, in
$XDG_DATA_HOME/opencode: harbor points that into the trial's agent/ dir).

opencode commits each step of a session as it goes, so the database holds every call of the
conversation when the CLI exits, unlike its text log, whose last lines may not be written by then.
- One assistant message per call: its parts carry the ids of the items the answer held
  (metadata.openai.itemId, e.g. `fc_<call>_0`, which name the proxy's response), the text, and the
  step-finish part the prompt size (tokens.input + tokens.cache.read).
- The title call is a side call with no message of its own: its answer becomes the session's title
  (first non-empty line, <think> blocks removed, cut to 100 characters); a session still titled
  `New session - <time>` made none that answered with text.
"""
from __future__ import annotations

import json
import re
import shutil
import sqlite3
import tempfile
from pathlib import Path

from wharf.collect.agents.calls import AgentCall, item_call

_DEFAULT_TITLE = re.compile(r"^(New session - |Child session - )\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
_THINK = re.compile(r"<think>[\s\S]*?</think>\s*")


def title_of(answer: str) -> str:
    """The session title opencode makes of the title call's answer ("" when it makes none)."""
    line = next((ln.strip() for ln in _THINK.sub("", answer).split("\n") if ln.strip()), "")
    return line[:97] + "..." if len(line) > 100 else line


def _call(parts: list[dict]) -> AgentCall:
    call = AgentCall(text="")
    for p in parts:
        item = ((p.get("metadata") or {}).get("openai") or {}).get("itemId")
        if isinstance(item, str) and item_call(item):
            call.response_ids.add("resp_" + item_call(item))
        if p.get("type") == "text":
            call.text += p.get("text", "")
        elif p.get("type") == "step-finish":
            tokens = p.get("tokens") or {}
            call.prompt_tokens = (tokens.get("input") or 0) + ((tokens.get("cache") or {}).get("read") or 0)
    return call


def read_session_db(path: Path) -> tuple[list[AgentCall], list[AgentCall]]:
    """(calls of the conversations in order, side calls: one per session opencode titled)."""
    with tempfile.TemporaryDirectory() as tmp:  # a copy: opening it may fold the WAL into the file
        for f in path.parent.glob(path.name + "*"):  # opencode.db, -wal, -shm: the data sits in the WAL
            shutil.copy2(f, Path(tmp) / f.name)
        return _read(sqlite3.connect(Path(tmp) / path.name))


def _read(db: sqlite3.Connection) -> tuple[list[AgentCall], list[AgentCall]]:
    try:
        messages = db.execute("SELECT id, data FROM message ORDER BY time_created, id").fetchall()
        parts: dict[str, list[dict]] = {}
        for mid, data in db.execute("SELECT message_id, data FROM part ORDER BY time_created, id"):
            parts.setdefault(mid, []).append(json.loads(data))
        titles = [t for (t,) in db.execute("SELECT title FROM session ORDER BY time_created")]
    finally:
        db.close()
    calls = []
    for mid, data in messages:
        info = json.loads(data)
        call = _call(parts.get(mid, []))
        # a call that failed is kept as a message with its error (the proxy's row is not ok)
        if info.get("role") == "assistant" and not (info.get("error") and not call.response_ids):
            calls.append(call)
    side = [AgentCall(text=t, derive=title_of) for t in titles if t and not _DEFAULT_TITLE.match(t)]
    return calls, side
