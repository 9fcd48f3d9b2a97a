"""Gemini generateContent <-> chat completions (what gemini-cli and the google-genai SDKs speak).

The model and the streaming choice are in the URL (`models/{model}:generateContent`,
`:streamGenerateContent?alt=sse`), not the body: `Call(model, stream)` is this dialect bound to
one call's URL, and is what the proxy's route hands the recording path.

Request: systemInstruction, contents (role user / model) with text, inlineData, functionCall and
functionResponse parts; thought parts and thoughtSignature are dropped (the token ids keep what was
said). tools (functionDeclarations), toolConfig and generationConfig: gemini_tools.py. The ids
of our functionCalls come back on functionResponses (a response without one answers the earliest
unanswered call of its name). Stateless: cachedContent is refused.
Answer: a GenerateContentResponse (one candidate, usageMetadata), or, streamed, one such chunk per
text piece or finished call and a last one with finishReason and usageMetadata, as `data:` lines.
"""
from __future__ import annotations

import json

from wharf.collect.proxy.dialects import (NOTES, ChatStream, DialectError, assistant_turn, context_overflow, parse_args,
                                    suffix, user_turn)
from wharf.collect.proxy.dialects.gemini_tools import camel_keys, chat_tools, generation, tool_choice
from wharf.collect.proxy.jsonx import dumps

NAME = "gemini"

_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
           409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL",
           501: "NOT_IMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS", "content_filter": "SAFETY"}


def error_body(status: int, message: str) -> dict:
    """Google's error shape; a context overflow in the real API's words."""
    over = context_overflow(message)
    if over is not None and over["input"] is not None:
        status = 400
        message = (f"The input token count ({over['input']}) exceeds the maximum number of tokens allowed "
                   f"({over['limit']}).")
    return {"error": {"code": status, "message": message, "status": _STATUS.get(status, "UNKNOWN")}}


# -- request --------------------------------------------------------------------------------------
def _parts(content, where: str) -> list[dict]:
    if not isinstance(content, dict):
        raise DialectError(f"{where}: expected a Content object with 'parts'")
    parts = content.get("parts")
    if not isinstance(parts, list):
        raise DialectError(f"{where}.parts: expected a list of parts")
    for j, p in enumerate(parts):
        if not isinstance(p, dict):
            raise DialectError(f"{where}.parts[{j}]: expected an object")
    # A part's own keys, and those of the objects in it (their values stay as sent).
    return [{k: camel_keys(v) if k != "text" else v for k, v in camel_keys(p).items()} for p in parts]


def _system(si) -> str:
    if isinstance(si, str):
        return si
    texts = []
    for j, p in enumerate(_parts(si, "systemInstruction")):
        if not isinstance(p.get("text"), str):
            raise DialectError(f"systemInstruction.parts[{j}]: only text parts are supported")
        texts.append(p["text"])
    return "\n\n".join(texts)


def _image(p: dict, where: str) -> dict:
    d = p["inlineData"]
    if not isinstance(d, dict) or not isinstance(d.get("data"), str):
        raise DialectError(f"{where}.inlineData: needs 'mimeType' and base64 'data'")
    return {"type": "image_url", "image_url": {"url": f"data:{d.get('mimeType', 'image/png')};base64,{d['data']}"}}


def _response_text(fr: dict) -> str:
    """A functionResponse's `response` as a tool message: gemini-cli's {"output": text} as the text,
    anything else as its JSON."""
    resp = fr.get("response")
    text = resp["output"] if isinstance(resp, dict) and list(resp) == ["output"] and isinstance(resp["output"], str) \
        else json.dumps(resp if resp is not None else {}, ensure_ascii=False)
    n = sum(1 for p in fr.get("parts") or () if isinstance(p, dict))
    return text + (f"\n[{n} media part{'s' * (n != 1)} omitted]" if n else "")


class _Calls:
    """The functionCalls the conversation made so far, to pair each functionResponse with its call."""

    def __init__(self):
        self.open: list[tuple[str, str]] = []  # (name, id) not answered yet, in call order

    def add(self, name: str, call_id: str) -> None:
        self.open.append((name, call_id))

    def answer(self, fr: dict, where: str) -> str:
        if not isinstance(fr.get("name"), str) and not isinstance(fr.get("id"), str):
            raise DialectError(f"{where}.functionResponse: needs a 'name' or an 'id'")
        want = fr.get("id")
        for k, (name, cid) in enumerate(self.open):
            if cid == want or (want is None and name == fr.get("name")):
                del self.open[k]
                return cid
        return want or f"call_{fr['name']}"  # a response to a call this history does not show


def _user(parts: list, where: str, calls: _Calls) -> list[dict]:
    tools, content = [], []
    for j, p in enumerate(parts):
        w = f"{where}.parts[{j}]"
        if isinstance(p.get("text"), str):
            if not p.get("thought"):
                content.append({"type": "text", "text": p["text"]})
        elif "inlineData" in p:
            content.append(_image(p, w))
        elif isinstance(p.get("functionResponse"), dict):
            fr = p["functionResponse"]
            # Chat wants tool messages right after the assistant's calls: they go first.
            tools.append({"role": "tool", "tool_call_id": calls.answer(fr, w), "content": _response_text(fr)})
        else:
            raise DialectError(f"{w}: part {sorted(p)} is not supported in a user turn "
                               "(text, inlineData, functionResponse)")
    return user_turn(tools, content)


def _model(parts: list, where: str, calls: _Calls, turn: int) -> dict:
    texts, tcs = [], []
    for j, p in enumerate(parts):
        w = f"{where}.parts[{j}]"
        if isinstance(p.get("text"), str):
            if not p.get("thought"):  # reasoning: not sent back, as the other dialects do
                texts.append(p["text"])
        elif isinstance(p.get("functionCall"), dict):
            fc = p["functionCall"]
            if not isinstance(fc.get("name"), str):
                raise DialectError(f"{w}.functionCall: needs a 'name' string")
            cid = fc["id"] if isinstance(fc.get("id"), str) and fc["id"] else f"call_{turn}_{j}"
            calls.add(fc["name"], cid)
            tcs.append({"id": cid, "type": "function", "function": {
                "name": fc["name"], "arguments": json.dumps(fc.get("args") or {}, ensure_ascii=False)}})
        else:
            raise DialectError(f"{w}: part {sorted(p)} is not supported in a model turn (text, functionCall)")
    return assistant_turn(texts, "", tcs)


def _messages(req: dict) -> list[dict]:
    contents = req.get("contents")
    if not isinstance(contents, list) or not contents:
        raise DialectError("'contents' must be a non-empty list of Content objects")
    out = [{"role": "system", "content": _system(req["systemInstruction"])}] if req.get("systemInstruction") else []
    calls = _Calls()
    for i, c in enumerate(contents):
        where = f"contents[{i}]"
        parts = _parts(c, where)
        role = c.get("role") or "user"  # the API reads a missing role as the user's
        if role == "user":
            out += _user(parts, where, calls)
        elif role == "model":
            out.append(_model(parts, where, calls, i))
        else:
            raise DialectError(f"{where}.role: expected 'user' or 'model', got {role!r}")
    if not any(m["role"] != "system" for m in out):
        raise DialectError("'contents' holds no turn for the model to answer")
    return out


def to_chat(req, stream: bool = False) -> dict:
    """A generateContent request as a chat completions body (before the proxy forces its fields)."""
    if not isinstance(req, dict):
        raise DialectError("request body must be a JSON object")
    req = camel_keys(req)
    if req.get("cachedContent"):
        raise DialectError("'cachedContent' is not supported: the recording proxy is stateless; "
                           "send the whole conversation in 'contents'")
    chat: dict = {"messages": _messages(req)}
    dropped: list[str] = []
    if req.get("tools"):
        chat["tools"] = chat_tools(req["tools"], dropped)
        if not chat["tools"]:
            del chat["tools"]
        elif req.get("toolConfig") is not None and tool_choice(req["toolConfig"]) is not None:
            chat["tool_choice"] = tool_choice(req["toolConfig"])
    if dropped:
        chat[NOTES] = {"dropped_tools": dropped}
    if req.get("generationConfig") is not None:
        generation(req["generationConfig"], chat)
    if stream:
        chat["stream"] = True
    return chat


def count_chat(req) -> dict:
    """A countTokens request ({contents}, or the whole {generateContentRequest}) as a chat body."""
    req = camel_keys(req)
    if isinstance(req, dict) and isinstance(req.get("generateContentRequest"), dict):
        req = req["generateContentRequest"]
    return to_chat(req)


def count_answer(n: int) -> dict:
    return {"totalTokens": n}


# -- answer ---------------------------------------------------------------------------------------
def _usage(n_in: int, n_out: int) -> dict:
    return {"promptTokenCount": n_in, "candidatesTokenCount": n_out, "totalTokenCount": n_in + n_out}


def _chunk(chat_id, model, parts: list, finish=None, usage=None) -> dict:
    cand = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        cand["finishReason"] = _FINISH.get(finish, "OTHER")
    out = {"candidates": [cand]}
    if usage is not None:
        out["usageMetadata"] = usage
    return {**out, "modelVersion": model, "responseId": suffix(chat_id)}


def _call_part(call_id, name: str, args) -> dict:
    return {"functionCall": {"id": call_id, "name": name, "args": parse_args(args)}}


def from_chat(data: dict, req: dict, model=None) -> dict:
    """A chat completion (vLLM's raw answer) as the GenerateContentResponse the agent gets."""
    c0 = data["choices"][0]
    msg = c0.get("message") or {}
    sfx = suffix(data.get("id"))
    parts = [{"text": msg["content"]}] if msg.get("content") else []
    for k, tc in enumerate(msg.get("tool_calls") or ()):
        fn = tc.get("function") or {}
        parts.append(_call_part(tc.get("id") or f"call_{sfx}_{k}", fn.get("name", ""), fn.get("arguments")))
    u = data.get("usage") or {}
    n_in = u.get("prompt_tokens", len(data.get("prompt_token_ids") or ()))
    n_out = u.get("completion_tokens", len(c0.get("token_ids") or ()))
    return _chunk(data.get("id"), model or data.get("model"), parts, c0.get("finish_reason") or "stop",
                  _usage(n_in, n_out))


class Stream(ChatStream):
    """Chat chunks in, Gemini's SSE chunks out: one per text piece, one per call once it is whole
    (its args as one object), and a last one with finishReason and usageMetadata. From the first
    finished call on, everything is held until tail(): the agent acts on nothing unrecorded."""

    def __init__(self, req: dict, model=None):
        super().__init__(req)
        self.model = model

    def _data(self, out: list, obj: dict) -> None:
        self._put(out, b"data: " + dumps(obj) + b"\n\n")

    def _on_start(self, out: list) -> None:
        pass  # Gemini's stream has no opening event

    def _tool_block(self, tc: dict, k: int) -> dict:
        return {"type": "functionCall", "id": tc.get("id") or f"call_{suffix(self.chat_id)}_{k}"}

    def _on_open(self, out: list, b: dict) -> None:
        pass

    def _on_text(self, out: list, b: dict, piece: str) -> None:
        self._data(out, _chunk(self.chat_id, self.model, [{"text": piece}]))

    def _on_close(self, out: list, b: dict, last: bool) -> None:
        if b["type"] == "functionCall":
            # Pieces arriving after the close are not sent: the args went out whole, here.
            b["part"] = _call_part(b["id"], b["name"], "".join(b.pop("args")))
            self._data(out, _chunk(self.chat_id, self.model, [b["part"]]))

    def _on_end(self, out: list) -> None:
        self._data(out, _chunk(self.chat_id, self.model, [], self.finish or "stop", _usage(*self._counts())))

    def final(self) -> dict:
        """The whole answer as one GenerateContentResponse (after tail(), which closes the last call)."""
        parts = [{"text": "".join(b["text"])} if b["type"] == "text" else b["part"] for b in self.blocks]
        return _chunk(self.chat_id, self.model, parts, self.finish or "stop", _usage(*self._counts()))

    def error(self, status: int, message: str) -> bytes:
        self.held = None  # nothing held goes out after an error
        return b"data: " + dumps(error_body(status, message)) + b"\n\n"


class Call:
    """The dialect bound to one call's URL (model, streaming or not): what the proxy's recording
    path calls as it calls a dialect module."""

    NAME = NAME
    error_body = staticmethod(error_body)
    count_chat = staticmethod(count_chat)
    count_answer = staticmethod(count_answer)

    def __init__(self, model: str, stream: bool):
        self.model, self.stream = model, stream

    def to_chat(self, req) -> dict:
        return to_chat(req, self.stream)

    def from_chat(self, data: dict, req: dict) -> dict:
        return from_chat(data, req, self.model)

    def Stream(self, req: dict) -> Stream:  # noqa: N802 - called as the dialect modules' Stream class is
        return Stream(req, self.model)
