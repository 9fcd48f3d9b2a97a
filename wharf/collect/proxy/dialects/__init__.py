"""Agent dialects the proxy translates to chat completions: Anthropic Messages, OpenAI Responses
and Gemini generateContent.

vLLM's own /v1/messages and /v1/responses return no token ids (and it has no Gemini API), so the
proxy speaks chat upstream and translates both ways here. Each dialect module is pure (no HTTP) and offers:
`NAME`, `to_chat(req) -> chat body`, `from_chat(chat answer, req) -> answer in the dialect`,
`error_body(status, message) -> dict` (worded as the real API words it where clients key on the
text), and `Stream(req)` (on `ChatStream` below): `feed(chat chunk)
-> bytes` for what may go out now, `tail() -> bytes` for the rest once the row is durable, `final()`
(the assembled answer the row stores), `error(status, message) -> bytes`. Those with a token
count route (anthropic, gemini) add `count_chat(req)` and `count_answer(n)`. Gemini names the model
and streaming in the URL: its route binds them first (`gemini.Call`), then calls it as a module.
"""
from __future__ import annotations

import json
import re
import uuid

# A key `to_chat` may add to the chat body: what the translation left out (e.g. {"dropped_tools":
# ["web_search"]}). The proxy takes it out before the body goes upstream and keeps it in the row.
NOTES = "wharf_notes"


class DialectError(ValueError):
    """The agent's request cannot be translated: answered 400, never recorded."""


# vLLM's (and the local engine's) context errors, old and new wordings.
_CTX_LIMIT = re.compile(r"maximum context length is (\d+) tokens")
_CTX_INPUT = re.compile(r"(?:request has|resulted in) (\d+) (?:input )?tokens|\((\d+) in the messages")
_CTX_MAX_TOKENS = re.compile(r"(?:too large: (\d+))|, (\d+) in the completion\)")


def context_overflow(message: str) -> dict | None:
    """{limit, input, max_tokens (None when the prompt alone is too long)} from an upstream error
    about the context window; None for any other error."""
    m = _CTX_LIMIT.search(message or "")
    if not m:
        return None
    inp = _CTX_INPUT.search(message)
    mt = _CTX_MAX_TOKENS.search(message)
    n_in = int(next(g for g in inp.groups() if g)) if inp else None
    n_max = int(next(g for g in mt.groups() if g)) if mt else None
    return {"limit": int(m.group(1)), "input": n_in, "max_tokens": n_max}


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


def user_turn(tool_messages: list[dict], parts: list[dict]) -> list[dict]:
    """A user turn as chat messages: its tool results first, then its content (plain text when
    every part is text, so a text-only template renders it)."""
    out = list(tool_messages)
    if parts:
        text = all(p["type"] == "text" for p in parts)
        out.append({"role": "user", "content": "\n\n".join(p["text"] for p in parts) if text else parts})
    return out


def assistant_turn(texts: list[str], sep: str, tool_calls: list[dict]) -> dict:
    """A model turn as a chat message: its texts joined by `sep`; content None only when it holds
    tool calls and no text part."""
    msg = {"role": "assistant", "content": sep.join(texts) if texts or not tool_calls else None}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return msg


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


class ChatStream:
    """The walk over chat chunks both dialects' `Stream` share; subclasses emit their own events.

    Blocks (text or tool call, in the order they open) carry `type`, `index`, and `text` (a list of
    pieces) or `name` and `args` (a list of argument pieces). Only one block is open at a time; a tool
    call's later argument pieces still land in its block, found by the chunk's tool index.
    Hold-back: from the first finished tool call on, every event goes to `held` until tail().

    Hooks: `_first(chunk)` (dialect state from the first chunk), `_on_start(out)`,
    `_tool_block(tc, k)` (a new tool block's type and id; `k` is the chat tool index), `_on_open(out, b)`,
    `_on_text(out, b, piece)`, `_on_args(out, b, piece)`, `_on_close(out, b, last)` (`last`: closed by
    tail(), the end of the answer), `_on_end(out)` (the closing events); emit with `_put`.
    """

    TEXT = "text"  # the type of a text block in this dialect

    def __init__(self, req: dict):
        self.req = req
        self.blocks: list[dict] = []
        self.open: dict | None = None
        self.by_tool: dict[int, dict] = {}
        self.held: list[bytes] | None = None
        self.chat_id = None
        self.model = req.get("model")
        self.n_in = self.n_out = 0
        self.usage = None
        self.finish = self.matched = None
        self.started = False

    def _put(self, out: list, event: bytes) -> None:
        (self.held if self.held is not None else out).append(event)

    def _hold(self) -> None:
        if self.held is None:
            self.held = []

    def _first(self, chunk: dict) -> None:
        pass

    def _on_args(self, out: list, b: dict, piece: str) -> None:
        pass

    def _start(self, out: list) -> None:
        self.started = True
        self._on_start(out)

    def _close(self, out: list, last: bool = False) -> None:
        b = self.open
        if b is None:
            return
        self.open = None
        if b["type"] != self.TEXT:  # a finished call the agent could act on: hold from here
            self._hold()
        self._on_close(out, b, last)

    def _open(self, out: list, block: dict) -> dict:
        self._close(out)
        block["index"] = len(self.blocks)
        self.blocks.append(block)
        self.open = block
        self._on_open(out, block)
        return block

    def feed(self, chunk: dict) -> bytes:
        out: list[bytes] = []
        if not self.started:
            self.chat_id = chunk.get("id")
            self.model = self.model or chunk.get("model")
            self.n_in = len(chunk.get("prompt_token_ids") or ())
            self._first(chunk)
            self._start(out)
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for c in chunk.get("choices") or ():
            self.n_out += len(c.get("token_ids") or ())
            d = c.get("delta") or {}
            if d.get("content"):
                b = self.open if self.open is not None and self.open["type"] == self.TEXT else \
                    self._open(out, {"type": self.TEXT, "text": []})
                b["text"].append(d["content"])
                self._on_text(out, b, d["content"])
            for tc in d.get("tool_calls") or ():
                k = tc.get("index", 0)
                fn = tc.get("function") or {}
                b = self.by_tool.get(k)
                if b is None:
                    b = self.by_tool[k] = self._open(out, {**self._tool_block(tc, k), "name": fn.get("name") or "",
                                                           "args": []})
                elif fn.get("name"):
                    b["name"] += fn["name"]
                if fn.get("arguments"):
                    # setdefault: a dialect may consume the pieces when the block closes.
                    b.setdefault("args", []).append(fn["arguments"])
                    self._on_args(out, b, fn["arguments"])
            if c.get("finish_reason") is not None:
                self.finish, self.matched = c["finish_reason"], c.get("stop_reason")
        return b"".join(out)

    def _counts(self) -> tuple[int, int]:
        u = self.usage or {}
        return u.get("prompt_tokens", self.n_in), u.get("completion_tokens", self.n_out)

    def tail(self) -> bytes:
        out: list[bytes] = []
        if not self.started:
            self._start(out)
        self._hold()
        self._close(out, last=True)
        self._on_end(out)
        held, self.held = self.held, None
        return b"".join(out + held)
