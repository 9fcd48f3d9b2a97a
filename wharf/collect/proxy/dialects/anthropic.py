"""Anthropic Messages <-> chat completions (what claude-code speaks).

Request: system (string or text blocks), messages with text / image / tool_use / tool_result
blocks, tools (input_schema), tool_choice, max_tokens, stop_sequences, stream. Sampling knobs
(temperature, top_p, top_k) are dropped: the proxy forces its own. Thinking blocks in the history
are dropped (the chat templates drop earlier reasoning anyway; the token ids keep what was said).
What claude-code adds is accepted: `system` messages inside `messages` (the mid-conversation-system
beta: leading ones join the system prompt, later ones stay system messages in place), `thinking`,
`output_config`, `context_management`, `metadata`, cache_control marks (all ignored: the upstream
has no use for them), and server tools (web_search, ...: dropped, counted in the row's notes).
Answer: a `message` with text and tool_use blocks, or the SSE event sequence of the real API.
"""
from __future__ import annotations

import json
import uuid

from wharf.collect.proxy.dialects import (NOTES, ChatStream, DialectError, assistant_turn, context_overflow, is_int,
                                    join_text, parse_args, sse, suffix, user_turn)
from wharf.collect.proxy.jsonx import dumps

NAME = "anthropic"

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error", 529: "overloaded_error"}


def error_body(status: int, message: str) -> dict:
    """The real API's error shape; a context overflow in the real API's words, which claude-code
    keys on ("prompt is too long: ..." compacts the conversation, "input length and `max_tokens`
    exceed context limit: ..." retries with a smaller max_tokens)."""
    over = context_overflow(message)
    if over is not None and over["input"] is not None:
        status = 400
        if over["max_tokens"] is not None and over["input"] < over["limit"]:
            message = (f"input length and `max_tokens` exceed context limit: {over['input']} + {over['max_tokens']} > "
                       f"{over['limit']}, decrease input length or `max_tokens` and try again")
        else:
            message = f"prompt is too long: {over['input']} tokens > {over['limit']} maximum"
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": message}}


# -- request --------------------------------------------------------------------------------------
def _image(block: dict, where: str) -> dict:
    src = block.get("source") or {}
    if src.get("type") == "base64":
        url = f"data:{src.get('media_type', 'image/png')};base64,{src.get('data', '')}"
    elif src.get("type") == "url":
        url = src.get("url")
    else:
        raise DialectError(f"{where}: image source type {src.get('type')!r} is not supported (base64 or url)")
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_result_text(content, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, list):  # images in a tool result cannot ride a chat tool message
        content = [b if b.get("type") != "image" else {"type": "text", "text": "[image omitted]"}
                   for b in content if isinstance(b, dict)]
    return join_text(content, where)


def _blocks(content: list, where: str):
    """(where, type, block) for each block of a message's content list."""
    if not isinstance(content, list):
        raise DialectError(f"{where}.content: expected a string or a list of content blocks")
    for j, b in enumerate(content):
        yield f"{where}.content[{j}]", (b.get("type") if isinstance(b, dict) else None), b


def _user(content, where: str) -> list[dict]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tools, parts = [], []
    for w, t, b in _blocks(content, where):
        if t == "text":
            if not isinstance(b.get("text"), str):
                raise DialectError(f"{w}: text block without a 'text' string")
            parts.append({"type": "text", "text": b["text"]})
        elif t == "image":
            parts.append(_image(b, w))
        elif t == "tool_result":
            if not isinstance(b.get("tool_use_id"), str):
                raise DialectError(f"{w}: tool_result without a 'tool_use_id' string")
            # Chat wants tool messages right after the assistant's calls: they go first.
            tools.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                          "content": _tool_result_text(b.get("content"), f"{w}.content")})
        else:
            raise DialectError(f"{w}: content block type {t!r} is not supported in a user message")
    return user_turn(tools, parts)


def _assistant(content, where: str) -> dict:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts, calls = [], []
    for w, t, b in _blocks(content, where):
        if t == "text":
            texts.append(str(b.get("text", "")))
        elif t == "tool_use":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                raise DialectError(f"{w}: tool_use needs 'id' and 'name' strings")
            calls.append({"id": b["id"], "type": "function",
                          "function": {"name": b["name"],
                                       "arguments": json.dumps(b.get("input") or {}, ensure_ascii=False)}})
        elif t in ("thinking", "redacted_thinking", "server_tool_use") or str(t).endswith("_tool_result"):
            continue  # reasoning, and server-tool traffic the proxy never produced
        else:
            raise DialectError(f"{w}: content block type {t!r} is not supported in an assistant message")
    return assistant_turn(texts, "\n\n", calls)


def _tools(tools, dropped: list) -> list[dict]:
    """Client tools as chat functions; server tools (typed web_search_20250305, ...) the upstream
    cannot run go to `dropped`."""
    if not isinstance(tools, list):
        raise DialectError("'tools' must be a list")
    out = []
    for j, t in enumerate(tools):
        if not isinstance(t, dict):
            raise DialectError(f"tools[{j}]: expected an object")
        if t.get("type") not in (None, "custom"):
            dropped.append(str(t.get("type")))
            continue
        if not isinstance(t.get("name"), str) or not isinstance(t.get("input_schema"), dict):
            raise DialectError(f"tools[{j}]: a tool needs 'name' (string) and 'input_schema' (object)")
        fn = {"name": t["name"], "parameters": t["input_schema"]}
        if t.get("description"):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(tc, chat: dict) -> None:
    if not isinstance(tc, dict):
        raise DialectError("'tool_choice' must be an object like {\"type\": \"auto\"}")
    kind = tc.get("type")
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool" and isinstance(tc.get("name"), str):
        chat["tool_choice"] = {"type": "function", "function": {"name": tc["name"]}}
    else:
        raise DialectError(f"tool_choice type {kind!r}: expected auto, any, none or tool (with a name)")
    if tc.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def to_chat(req) -> dict:
    """An Anthropic Messages request as a chat completions body (before the proxy forces its fields)."""
    if not isinstance(req, dict):
        raise DialectError("request body must be a JSON object")
    msgs = req.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise DialectError("'messages' must be a non-empty list")
    if not is_int(req.get("max_tokens")) or req["max_tokens"] < 1:
        raise DialectError("'max_tokens' is required: a positive integer")
    system = [join_text(req["system"], "system")] if req.get("system") else []
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role == "user":
            out += _user(m.get("content"), where)
        elif role == "assistant":
            out.append(_assistant(m.get("content"), where))
        elif role == "system":
            text = join_text(m.get("content") or "", f"{where}.content")
            if out:  # mid-conversation: in place, as the real API reads it
                out.append({"role": "system", "content": text})
            else:  # before any turn: part of the one system prompt chat templates expect first
                system.append(text)
        else:
            raise DialectError(f"{where}.role: expected 'user', 'assistant' or 'system', got {role!r}")
    if system:
        out.insert(0, {"role": "system", "content": "\n\n".join(system)})
    chat = {"messages": out, "max_tokens": req["max_tokens"]}
    dropped: list[str] = []
    if req.get("tools"):
        chat["tools"] = _tools(req["tools"], dropped)
        if not chat["tools"]:
            del chat["tools"]
        elif req.get("tool_choice") is not None:
            _tool_choice(req["tool_choice"], chat)
    if dropped:
        chat[NOTES] = {"dropped_tools": dropped}
    stops = req.get("stop_sequences")
    if stops:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise DialectError("'stop_sequences' must be a list of strings")
        chat["stop"] = stops
    if req.get("stream"):
        chat["stream"] = True
    return chat


def count_chat(req) -> dict:
    """A count_tokens request (a Messages request but for max_tokens, which it does not take) as chat."""
    return to_chat({**req, "max_tokens": 1} if isinstance(req, dict) else req)


def count_answer(n: int) -> dict:
    return {"input_tokens": n}


# -- answer ---------------------------------------------------------------------------------------
def _stop(finish, matched, has_tools: bool, req: dict) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) from chat's finish_reason and vLLM's matched stop string."""
    if finish == "length":
        return "max_tokens", None
    if has_tools or finish == "tool_calls":
        return "tool_use", None
    if isinstance(matched, str) and matched in (req.get("stop_sequences") or ()):
        return "stop_sequence", matched
    return "end_turn", None


def _usage(n_in: int, n_out: int) -> dict:
    return {"input_tokens": n_in, "output_tokens": n_out, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0}


def _message(chat_id, model, content: list, stop: tuple, usage: dict) -> dict:
    return {"id": "msg_" + suffix(chat_id), "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop[0], "stop_sequence": stop[1], "stop_details": None, "usage": usage}


def _counts(data: dict) -> tuple[int, int]:
    u = data.get("usage") or {}
    c0 = data["choices"][0]
    return (u.get("prompt_tokens", len(data.get("prompt_token_ids") or ())),
            u.get("completion_tokens", len(c0.get("token_ids") or ())))


def from_chat(data: dict, req: dict) -> dict:
    """A chat completion (vLLM's raw answer) as the Anthropic message the agent gets."""
    c0 = data["choices"][0]
    msg = c0.get("message") or {}
    content = []
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    for tc in msg.get("tool_calls") or ():
        fn = tc.get("function") or {}
        content.append({"type": "tool_use", "id": tc.get("id") or f"toolu_{uuid.uuid4().hex[:24]}",
                        "name": fn.get("name", ""), "input": parse_args(fn.get("arguments"))})
    stop = _stop(c0.get("finish_reason"), c0.get("stop_reason"), bool(msg.get("tool_calls")), req)
    return _message(data.get("id"), req.get("model") or data.get("model"), content, stop, _usage(*_counts(data)))


class Stream(ChatStream):
    """Chat chunks in, Anthropic SSE events out (message_start ... message_stop).

    Tool arguments go out as one input_json_delta when their block closes, checked to be a JSON
    object (a partial, invalid one would break the SDK's parser). From the first finished tool_use
    block on, everything is held until tail(): the agent acts on nothing unrecorded.
    """

    def _ev(self, out: list, name: str, obj: dict) -> None:
        self._put(out, sse(name, obj, dumps))

    def _on_start(self, out: list) -> None:
        msg = {"id": "msg_" + suffix(self.chat_id), "type": "message", "role": "assistant", "model": self.model,
               "content": [], "stop_reason": None, "stop_sequence": None, "stop_details": None,
               "usage": _usage(self.n_in, 0)}
        self._ev(out, "message_start", {"type": "message_start", "message": msg})
        self._ev(out, "ping", {"type": "ping"})

    def _tool_block(self, tc: dict, k: int) -> dict:
        return {"type": "tool_use", "id": tc.get("id") or f"toolu_{uuid.uuid4().hex[:24]}"}

    def _on_open(self, out: list, block: dict) -> None:
        shown = {"type": "text", "text": ""} if block["type"] == "text" else \
            {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        self._ev(out, "content_block_start", {"type": "content_block_start", "index": block["index"],
                                              "content_block": shown})

    def _on_text(self, out: list, b: dict, piece: str) -> None:
        self._ev(out, "content_block_delta", {"type": "content_block_delta", "index": b["index"],
                                              "delta": {"type": "text_delta", "text": piece}})

    def _on_close(self, out: list, b: dict, last: bool) -> None:
        if b["type"] == "tool_use":
            # Pieces arriving after the close are not sent: the input went out whole, here.
            b["input"] = parse_args("".join(b.pop("args")))
            self._ev(out, "content_block_delta", {"type": "content_block_delta", "index": b["index"], "delta": {
                "type": "input_json_delta", "partial_json": dumps(b["input"]).decode()}})
        self._ev(out, "content_block_stop", {"type": "content_block_stop", "index": b["index"]})

    def _stop(self) -> tuple:
        return _stop(self.finish, self.matched, any(b["type"] == "tool_use" for b in self.blocks), self.req)

    def _on_end(self, out: list) -> None:
        stop = self._stop()
        n_in, n_out = self._counts()
        self._ev(out, "message_delta", {"type": "message_delta",
                                        "delta": {"stop_reason": stop[0], "stop_sequence": stop[1],
                                                  "stop_details": None},
                                        "usage": {"input_tokens": n_in, "output_tokens": n_out}})
        self._ev(out, "message_stop", {"type": "message_stop"})

    def final(self) -> dict:
        """The assembled message (call after tail(), which closes the last block)."""
        content = []
        for b in self.blocks:
            if b["type"] == "text":
                content.append({"type": "text", "text": "".join(b["text"])})
            else:
                content.append({"type": "tool_use", "id": b["id"], "name": b["name"], "input": b["input"]})
        return _message(self.chat_id, self.model, content, self._stop(), _usage(*self._counts()))

    def error(self, status: int, message: str) -> bytes:
        return sse("error", error_body(status, message), dumps)
