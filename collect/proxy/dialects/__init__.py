"""Agent dialects the proxy translates to chat completions: Anthropic Messages and OpenAI Responses.

vLLM's own /v1/messages and /v1/responses return no token ids, so the proxy speaks chat upstream
and translates both ways here. Each dialect module is pure (no HTTP) and offers:
`NAME`, `to_chat(req) -> chat body`, `from_chat(chat answer, req) -> answer in the dialect`,
`error_body(status, message) -> dict`, and `Stream(req)`: `feed(chat chunk) -> bytes` for what may
go out now, `tail() -> bytes` for the rest once the row is durable, `final()` (the assembled
answer the row stores), `error(status, message) -> bytes`.
"""
from __future__ import annotations

import json
import uuid


class DialectError(ValueError):
    """The agent's request cannot be translated: answered 400, never recorded."""


def join_text(parts, where: str, text_types=("text",)) -> str:
    """A string, or a list of text blocks/parts, as one string (blocks joined by a blank line)."""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        raise DialectError(f"{where}: expected a string or a list of text blocks")
    out = []
    for j, p in enumerate(parts):
        if not isinstance(p, dict) or p.get("type") not in text_types or not isinstance(p.get("text"), str):
            kind = p.get("type") if isinstance(p, dict) else type(p).__name__
            raise DialectError(f"{where}[{j}]: expected a text block ({'/'.join(text_types)}), got {kind!r}")
        out.append(p["text"])
    return "\n\n".join(out)


def suffix(chat_id) -> str:
    """The chat completion id without its prefix: dialect ids derive from it, stream and full alike."""
    s = str(chat_id or "")
    s = s.split("-", 1)[1] if s.startswith("chatcmpl-") else s
    return s or uuid.uuid4().hex


def parse_args(arguments) -> dict:
    """Tool-call arguments as an object; {} when the model wrote no JSON object (ids keep the truth)."""
    if isinstance(arguments, dict):
        return arguments
    try:
        val = json.loads(arguments) if arguments else {}
    except (TypeError, ValueError):
        return {}
    return val if isinstance(val, dict) else {}


def sse(event: str, obj: dict, dumps) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + dumps(obj) + b"\n\n"


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
