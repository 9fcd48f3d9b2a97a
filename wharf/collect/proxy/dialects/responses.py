"""OpenAI Responses <-> chat completions (what codex speaks).

Stateless: the full conversation comes in `input` (codex sends it with store=false), so
`previous_response_id` and item references are refused. Input items: messages (input_text /
output_text parts), function_call, function_call_output, custom_tool_call(_output); reasoning and
hosted-tool items are dropped. Tools: functions; `namespace` groups (codex's multi_agent_v1) are
flattened to functions named as their members (prefixed `<namespace>.` only on a clash) and their
calls go back with `namespace` set, as codex reads them; `custom` (freeform) tools become functions
of one string `input` and go back as custom_tool_call; hosted tools (web_search, file_search, ...)
that the upstream cannot run are dropped and counted in the row's notes. Answer: a `response`
object with message and function_call output items, or the SSE event sequence (response.created
... response.completed).
"""
from __future__ import annotations

import json
import time

from wharf.collect.proxy.dialects import NOTES, ChatStream, DialectError, context_overflow, is_int, join_text, sse, suffix
from wharf.collect.proxy.dialects.responses_tools import call_item, chat_name, chat_tools, tool_choice, tool_map
from wharf.collect.proxy.jsonx import dumps

NAME = "responses"

_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error"}


# OpenAI's own words for a prompt over the context window; codex keys on the code.
_CONTEXT_CODE = "context_length_exceeded"
_CONTEXT_MESSAGE = "Your input exceeds the context window of this model. Please adjust your input and try again."


def error_body(status: int, message: str) -> dict:
    if context_overflow(message) is not None:
        return {"error": {"message": _CONTEXT_MESSAGE, "type": "invalid_request_error", "param": "input",
                          "code": _CONTEXT_CODE}}
    return {"error": {"message": message, "type": _ERROR_TYPES.get(status, "server_error"), "param": None,
                      "code": status}}


# -- request --------------------------------------------------------------------------------------
def _content(content, where: str):
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise DialectError(f"{where}: expected a string or a list of content parts")
    parts = []
    for j, p in enumerate(content):
        t = p.get("type") if isinstance(p, dict) else None
        if t in _TEXT_PARTS:
            parts.append({"type": "text", "text": str(p.get("text") or p.get("refusal") or "")})
        elif t == "input_image" and isinstance(p.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": p["image_url"]}})
        else:
            raise DialectError(f"{where}[{j}]: content part type {t!r} is not supported "
                               "(input_text, output_text, input_image with image_url)")
    if all(p["type"] == "text" for p in parts):
        return "\n\n".join(p["text"] for p in parts)
    return parts


def _call(out: list, call: dict) -> None:
    last = out[-1] if out else None
    # Consecutive calls (and the text before them) are one assistant turn in chat.
    if last is not None and last["role"] == "assistant" and isinstance(last.get("content"), (str, type(None))):
        last.setdefault("tool_calls", []).append(call)
    else:
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})


# Items of hosted tools and of client state the upstream never saw: nothing for the model to read.
_SKIPPED_ITEMS = ("reasoning", "web_search_call", "file_search_call", "image_generation_call", "code_interpreter_call",
                  "compaction", "compaction_summary", "tool_search_call", "tool_search_output")


def _items(items: list, out: list, tmap: dict) -> None:
    for i, it in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(it, dict):
            raise DialectError(f"{where}: expected an object")
        t = it.get("type") or ("message" if "role" in it else None)
        if t == "message":
            role = it.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise DialectError(f"{where}.role: expected user, assistant, system or developer, got {role!r}")
            out.append({"role": "system" if role == "developer" else role,
                        "content": _content(it.get("content"), f"{where}.content")})
        elif t == "function_call":
            if not isinstance(it.get("call_id"), str) or not isinstance(it.get("name"), str):
                raise DialectError(f"{where}: function_call needs 'call_id' and 'name' strings")
            _call(out, {"id": it["call_id"], "type": "function",
                        "function": {"name": chat_name(it["name"], it.get("namespace"), tmap),
                                     "arguments": it.get("arguments") or "{}"}})
        elif t == "custom_tool_call":
            if not isinstance(it.get("call_id"), str) or not isinstance(it.get("name"), str):
                raise DialectError(f"{where}: custom_tool_call needs 'call_id' and 'name' strings")
            args = json.dumps({"input": str(it.get("input") or "")}, ensure_ascii=False)
            _call(out, {"id": it["call_id"], "type": "function",
                        "function": {"name": chat_name(it["name"], it.get("namespace"), tmap), "arguments": args}})
        elif t in ("function_call_output", "custom_tool_call_output"):
            if not isinstance(it.get("call_id"), str):
                raise DialectError(f"{where}: function_call_output needs a 'call_id' string")
            output = it.get("output")
            text = output if isinstance(output, str) else join_text(output or [], f"{where}.output", _TEXT_PARTS)
            out.append({"role": "tool", "tool_call_id": it["call_id"], "content": text})
        elif t in _SKIPPED_ITEMS:
            continue
        elif t == "item_reference":
            raise DialectError(f"{where}: item_reference needs stored responses; the proxy is stateless, "
                               "send the items themselves")
        else:
            raise DialectError(f"{where}: input item type {t!r} is not supported "
                               "(message, function_call, function_call_output, reasoning)")


def to_chat(req) -> dict:
    """A Responses request as a chat completions body (before the proxy forces its fields)."""
    if not isinstance(req, dict):
        raise DialectError("request body must be a JSON object")
    if req.get("previous_response_id"):
        raise DialectError("previous_response_id is not supported: the recording proxy stores no responses; "
                           "send the whole conversation in 'input' (store=false)")
    if req.get("conversation"):
        raise DialectError("'conversation' is not supported: the recording proxy is stateless")
    inp = req.get("input")
    tmap = tool_map(req)
    out: list[dict] = []
    if req.get("instructions"):
        if not isinstance(req["instructions"], str):
            raise DialectError("'instructions' must be a string")
        out.append({"role": "system", "content": req["instructions"]})
    if isinstance(inp, str):
        out.append({"role": "user", "content": inp})
    elif isinstance(inp, list):
        _items(inp, out, tmap)
    else:
        raise DialectError("'input' is required: a string or a list of input items")
    # Instructions plus leading developer messages: one system message (templates expect one).
    while len(out) > 1 and out[0]["role"] == out[1]["role"] == "system" \
            and isinstance(out[0]["content"], str) and isinstance(out[1]["content"], str):
        out[:2] = [{"role": "system", "content": out[0]["content"] + "\n\n" + out[1]["content"]}]
    if not any(m["role"] != "system" for m in out):
        raise DialectError("'input' holds no message for the model to answer")
    chat: dict = {"messages": out}
    dropped: list[str] = []
    if req.get("tools"):
        chat["tools"] = chat_tools(req["tools"], tmap, dropped)
        if not chat["tools"]:
            del chat["tools"]
        elif req.get("tool_choice") is not None:
            chat["tool_choice"] = tool_choice(req["tool_choice"], tmap)
    if dropped:
        chat[NOTES] = {"dropped_tools": dropped}
    if isinstance(req.get("parallel_tool_calls"), bool) and "tools" in chat:
        chat["parallel_tool_calls"] = req["parallel_tool_calls"]
    mot = req.get("max_output_tokens")
    if mot is not None:
        if not is_int(mot) or mot < 1:
            raise DialectError("'max_output_tokens' must be a positive integer")
        chat["max_tokens"] = mot
    fmt = (req.get("text") or {}).get("format") if isinstance(req.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        chat["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.get("name") or "output", "schema": fmt.get("schema") or {}, "strict": bool(fmt.get("strict"))}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    if req.get("stream"):
        chat["stream"] = True
    return chat


# -- answer ---------------------------------------------------------------------------------------
def _usage(n_in: int, n_out: int) -> dict:
    return {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": n_out,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": n_in + n_out}


def _response(sfx: str, created: int, req: dict, model, status: str, output: list, usage, error=None,
              incomplete=None) -> dict:
    return {"id": "resp_" + sfx, "object": "response", "created_at": created, "status": status, "error": error,
            "incomplete_details": incomplete, "instructions": req.get("instructions"),
            "max_output_tokens": req.get("max_output_tokens"), "model": model, "output": output,
            "parallel_tool_calls": req.get("parallel_tool_calls", True), "previous_response_id": None,
            "reasoning": req.get("reasoning"), "store": False, "text": req.get("text") or {"format": {"type": "text"}},
            "tool_choice": req.get("tool_choice", "auto"), "tools": req.get("tools") or [], "truncation": "disabled",
            "usage": usage, "metadata": req.get("metadata") or {}}


def _end(finish) -> tuple[str, dict | None]:
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _msg_item(sfx: str, i: int, text: str, status: str) -> dict:
    return {"id": f"msg_{sfx}_{i}", "type": "message", "status": status, "role": "assistant",
            "content": [_text_part(text)] if status != "in_progress" else []}


def from_chat(data: dict, req: dict) -> dict:
    """A chat completion (vLLM's raw answer) as the Responses object the agent gets."""
    c0 = data["choices"][0]
    msg = c0.get("message") or {}
    sfx = suffix(data.get("id"))
    tmap = tool_map(req)
    output = []
    if msg.get("content"):
        output.append(_msg_item(sfx, len(output), msg["content"], "completed"))
    for tc in msg.get("tool_calls") or ():
        fn = tc.get("function") or {}
        output.append(call_item(sfx, len(output), tc.get("id") or f"call_{sfx}_{len(output)}", fn.get("name", ""),
                               fn.get("arguments") or "{}", "completed", tmap))
    u = data.get("usage") or {}
    status, incomplete = _end(c0.get("finish_reason"))
    return _response(sfx, int(data.get("created") or time.time()), req, req.get("model") or data.get("model"),
                     status, output, _usage(u.get("prompt_tokens", 0), u.get("completion_tokens", 0)),
                     incomplete=incomplete)


class Stream(ChatStream):
    """Chat chunks in, Responses SSE events out (response.created ... response.completed).

    From the first finished function_call item on, everything is held until tail(): codex runs
    a call when its output_item.done arrives, and must act on nothing unrecorded.
    """

    TEXT = "message"

    def __init__(self, req: dict):
        super().__init__(req)
        self.seq = 0
        self.tmap = tool_map(req)
        self.sfx = ""
        self.created = int(time.time())

    def _ev(self, out: list, obj: dict) -> None:
        obj["sequence_number"] = self.seq
        self.seq += 1
        self._put(out, sse(obj["type"], obj, dumps))

    def _envelope(self, status: str, output: list, usage=None, error=None, incomplete=None) -> dict:
        return _response(self.sfx, self.created, self.req, self.model, status, output, usage, error, incomplete)

    def _first(self, chunk: dict) -> None:
        self.sfx = suffix(self.chat_id)
        self.created = int(chunk.get("created") or self.created)

    def _on_start(self, out: list) -> None:
        for t in ("response.created", "response.in_progress"):
            self._ev(out, {"type": t, "response": self._envelope("in_progress", [])})

    def _item(self, it: dict, status: str) -> dict:
        if it["type"] == "message":
            return _msg_item(self.sfx, it["index"], "".join(it["text"]), status)
        return call_item(self.sfx, it["index"], it["call_id"], it["name"], "".join(it["args"]), status, self.tmap)

    def _custom(self, it: dict) -> bool:
        return bool((self.tmap.get(it["name"]) or {}).get("custom"))

    def _tool_block(self, tc: dict, k: int) -> dict:
        return {"type": "function_call", "call_id": tc.get("id") or f"call_{self.sfx}_{k}"}

    def _on_open(self, out: list, it: dict) -> None:
        self._ev(out, {"type": "response.output_item.added", "output_index": it["index"],
                       "item": self._item(it, "in_progress")})
        if it["type"] == "message":
            self._ev(out, {"type": "response.content_part.added", "item_id": f"msg_{self.sfx}_{it['index']}",
                           "output_index": it["index"], "content_index": 0, "part": _text_part("")})

    def _on_text(self, out: list, it: dict, piece: str) -> None:
        self._ev(out, {"type": "response.output_text.delta", "item_id": f"msg_{self.sfx}_{it['index']}",
                       "output_index": it["index"], "content_index": 0, "delta": piece, "logprobs": []})

    def _on_args(self, out: list, it: dict, piece: str) -> None:
        # A closed item's arguments went out whole in its done events; a custom call's input only there.
        if it is self.open and not self._custom(it):
            self._ev(out, {"type": "response.function_call_arguments.delta",
                           "item_id": f"fc_{self.sfx}_{it['index']}", "output_index": it["index"], "delta": piece})

    def _on_close(self, out: list, it: dict, last: bool) -> None:
        # The item open at the end is the one a length stop cut off.
        status = "incomplete" if last and _end(self.finish)[1] else "completed"
        it["status"] = status
        done = self._item(it, status)
        base = {"item_id": done["id"], "output_index": it["index"]}
        if it["type"] == "message":
            text = done["content"][0]["text"]
            self._ev(out, {"type": "response.output_text.done", **base, "content_index": 0, "text": text,
                           "logprobs": []})
            self._ev(out, {"type": "response.content_part.done", **base, "content_index": 0, "part": _text_part(text)})
        elif done["type"] == "custom_tool_call":
            self._ev(out, {"type": "response.custom_tool_call_input.done", **base, "input": done["input"]})
        else:
            self._ev(out, {"type": "response.function_call_arguments.done", **base, "name": done["name"],
                           "arguments": done["arguments"]})
        self._ev(out, {"type": "response.output_item.done", "output_index": it["index"], "item": done})

    def _on_end(self, out: list) -> None:
        self._ev(out, {"type": f"response.{_end(self.finish)[0]}", "response": self.final()})

    def final(self) -> dict:
        """The assembled response (after tail(), which closes the last item)."""
        status, incomplete = _end(self.finish)
        output = [self._item(it, it.get("status", "completed")) for it in self.blocks]
        return self._envelope(status, output, _usage(*self._counts()), incomplete=incomplete)

    def error(self, status: int, message: str) -> bytes:
        body = error_body(status, message)["error"]
        out: list[bytes] = []
        self.held = None
        code = body["code"] if body["code"] == _CONTEXT_CODE else "server_error"
        self._ev(out, {"type": "error", "code": code if code == _CONTEXT_CODE else body["type"],
                       "message": body["message"], "param": body["param"]})
        self._ev(out, {"type": "response.failed", "response": self._envelope(
            "failed", [], error={"code": code, "message": body["message"]})})
        return b"".join(out)
