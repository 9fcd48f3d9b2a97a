"""Reading token ids and log-probs out of vLLM chat answers, and making the answer OpenAI-plain again.

vLLM (>= 0.10, with return_token_ids) answers with `prompt_token_ids` at the top level and
`choices[i].token_ids` plus per-token log-probs; a stream carries the prompt ids in its first chunk and
each chunk its own token ids. Every check here guards the training data:
a call whose ids do not add up is reported as an upstream error rather than recorded half-right.
"""
from __future__ import annotations

import array

from wharf.collect.proxy.jsonx import dumps

# vLLM-only fields an OpenAI client was never meant to see.
_TOP_EXTRAS = ("prompt_token_ids", "prompt_logprobs", "kv_transfer_params")
_CHOICE_EXTRAS = ("token_ids", "stop_reason")


class CaptureError(ValueError):
    """The upstream answer lacks what the recording needs (token ids, log-probs, consistency)."""


def _ids(value, where: str) -> array.array:
    """Token ids as a compact int32 array; converting in C also checks every id is an int32."""
    if isinstance(value, list):
        try:
            return array.array("i", value)
        except (TypeError, OverflowError):
            pass
    raise CaptureError(f"upstream answer has no usable {where} (got {str(value)[:80]}); "
                       "is the endpoint vLLM >= 0.10 or the wharf engine, called with return_token_ids? "
                       "(a teacher that returns no token ids: proxy.text_only=true records its text for SFT)")


def _logprobs(lp_obj, where: str) -> array.array:
    content = (lp_obj or {}).get("content") if isinstance(lp_obj, dict) else None
    if not isinstance(content, list):
        raise CaptureError(f"upstream answer has no {where}.logprobs.content")
    try:
        return array.array("f", [e["logprob"] for e in content])
    except (KeyError, TypeError, ValueError) as e:
        raise CaptureError(f"malformed {where}.logprobs.content entry ({e!r})") from None


def _check_usage(usage, n_prompt: int, n_completion: int) -> None:
    if not isinstance(usage, dict):
        return
    if usage.get("prompt_tokens") not in (None, n_prompt):
        raise CaptureError(f"usage.prompt_tokens={usage['prompt_tokens']} but {n_prompt} prompt ids came back")
    if usage.get("completion_tokens") not in (None, n_completion):
        raise CaptureError(f"usage.completion_tokens={usage['completion_tokens']} but {n_completion} "
                           "completion ids came back")


def capture_full(data: dict) -> dict:
    """A non-streaming answer -> {prompt_token_ids, completion_token_ids, completion_logprobs, finish_reason}."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise CaptureError("upstream answer has no choices")
    c0 = choices[0]
    prompt = _ids(data.get("prompt_token_ids"), "prompt_token_ids")
    completion = _ids(c0.get("token_ids"), "choices[0].token_ids")
    lps = _logprobs(c0.get("logprobs"), "choices[0]")
    if len(lps) != len(completion):
        raise CaptureError(f"{len(lps)} logprobs for {len(completion)} completion ids")
    _check_usage(data.get("usage"), len(prompt), len(completion))
    return {"prompt_token_ids": prompt, "completion_token_ids": completion, "completion_logprobs": lps,
            "finish_reason": c0.get("finish_reason")}


def capture_text(data: dict) -> dict:
    """A teacher's non-streaming answer (proxy.text_only): no ids or log-probs, only its choice checked."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict) \
            or not isinstance(choices[0].get("message"), dict):
        raise CaptureError("upstream answer has no choices[0].message")
    return {**_NO_IDS, "finish_reason": choices[0].get("finish_reason")}


_NO_IDS = {"prompt_token_ids": [], "completion_token_ids": [], "completion_logprobs": []}


def plain_full(data: dict, agent_model, keep_logprobs: bool) -> dict:
    """The answer as an OpenAI server gives it: no vLLM extras, the agent's own model name."""
    for k in _TOP_EXTRAS:
        data.pop(k, None)
    for c in data.get("choices") or ():
        for k in _CHOICE_EXTRAS:
            c.pop(k, None)
        if not keep_logprobs:
            c["logprobs"] = None
    if agent_model is not None:
        data["model"] = agent_model
    return data


class StreamCapture:
    """Collects ids, log-probs and the message from chat.completion.chunk objects as they pass."""

    def __init__(self):
        self.prompt: array.array | None = None
        self.completion = array.array("i")
        self.logprobs = array.array("f")
        self.finish_reason = None
        self.usage = None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict] = {}
        self.role = "assistant"
        self.first: dict | None = None
        self.n_chunks = 0

    def add(self, chunk: dict) -> None:
        self.n_chunks += 1
        if self.first is None:
            self.first = {k: chunk.get(k) for k in ("id", "object", "created", "model")}
        if chunk.get("prompt_token_ids") is not None:
            if self.prompt is not None:
                raise CaptureError("prompt_token_ids came twice in one stream")
            self.prompt = _ids(chunk["prompt_token_ids"], "prompt_token_ids")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for c in chunk.get("choices") or ():
            if c.get("index", 0) != 0:
                raise CaptureError("more than one choice in a stream (n > 1 is not recorded)")
            ids = c.get("token_ids")
            if ids:  # may be absent on a chunk that carries no new tokens
                self.completion += _ids(ids, "choices[0].token_ids")
            lp = c.get("logprobs")
            if lp:
                self.logprobs += _logprobs(lp, "choices[0]")
            if c.get("finish_reason") is not None:
                self.finish_reason = c["finish_reason"]
            delta = c.get("delta") or {}
            if delta.get("role"):
                self.role = delta["role"]
            if delta.get("content"):
                self.content.append(delta["content"])
            if delta.get("reasoning"):
                self.reasoning.append(delta["reasoning"])
            for tc in delta.get("tool_calls") or ():
                slot = self.tool_calls.setdefault(tc.get("index", 0), {"id": None, "type": "function",
                                                                       "function": {"name": "", "arguments": ""}})
                if tc.get("id"):
                    slot["id"] = tc["id"]
                if tc.get("type"):
                    slot["type"] = tc["type"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] += fn["name"]
                if fn.get("arguments"):
                    slot["function"]["arguments"] += fn["arguments"]

    def result(self, text_only: bool = False) -> dict:
        """Checks the stream added up (ids vs log-probs vs usage) and returns the captured fields;
        `text_only` (a teacher): the text is all there is, nothing to check but that it ended."""
        if text_only:
            if self.n_chunks == 0:
                raise CaptureError("stream carried no chunks")
            return {**_NO_IDS, "finish_reason": self.finish_reason}
        if self.prompt is None:
            raise CaptureError("stream carried no prompt_token_ids (expected in the first chunk)")
        if not self.completion and self.logprobs:
            raise CaptureError("stream carried no choices[0].token_ids")
        if len(self.logprobs) != len(self.completion):
            raise CaptureError(f"stream carried {len(self.logprobs)} logprobs for {len(self.completion)} ids")
        if self.usage is None:
            raise CaptureError("stream ended without the usage chunk (stream_options.include_usage)")
        _check_usage(self.usage, len(self.prompt), len(self.completion))
        return {"prompt_token_ids": self.prompt, "completion_token_ids": self.completion,
                "completion_logprobs": self.logprobs, "finish_reason": self.finish_reason}

    def message(self, agent_model) -> dict:
        """The streamed answer assembled as one chat.completion (what the row stores as `response`)."""
        msg = {"role": self.role, "content": "".join(self.content) if self.content or not self.tool_calls else None}
        if self.reasoning:
            msg["reasoning"] = "".join(self.reasoning)
        if self.tool_calls:
            msg["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        first = self.first or {}
        return {"id": first.get("id"), "object": "chat.completion", "created": first.get("created"),
                "model": agent_model if agent_model is not None else first.get("model"),
                "choices": [{"index": 0, "message": msg, "finish_reason": self.finish_reason}],
                "usage": self.usage}


def plain_chunk(chunk: dict, agent_model, keep_logprobs: bool, keep_usage: bool) -> dict | None:
    """A chunk as an OpenAI server streams it; None to drop it (the usage chunk nobody asked for)."""
    if not chunk.get("choices") and chunk.get("usage") and not keep_usage:
        return None
    for k in _TOP_EXTRAS:
        chunk.pop(k, None)
    if not keep_usage and "usage" in chunk:
        chunk.pop("usage")
    for c in chunk.get("choices") or ():
        for k in _CHOICE_EXTRAS:
            c.pop(k, None)
        if not keep_logprobs and "logprobs" in c:
            c["logprobs"] = None
    if agent_model is not None and "model" in chunk:
        chunk["model"] = agent_model
    return chunk


class StreamRelay:
    """One stream's chunks on their way to the agent: captured for the row, and passed on plain (or
    translated by a dialect's Stream). From the finish_reason chunk on, everything is held back
    (`finish()` returns it as the tail): it goes out only once the row is durable."""

    def __init__(self, req: dict, translator=None, text_only: bool = False):
        self.cap = StreamCapture()
        self.text_only = text_only
        self.tr = translator  # a dialect's Stream holds back its own tail
        self.agent_model = req.get("model")
        self.keep_logprobs = bool(req.get("logprobs"))
        self.keep_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        self.held: list[bytes] = []

    def feed(self, chunks: list[dict]) -> bytes:
        """What to send the agent now for these chunks."""
        send: list[bytes] = []
        for chunk in chunks:
            self.cap.add(chunk)
            if self.tr is not None:
                events = self.tr.feed(chunk)
                if events:
                    send.append(events)
                continue
            plain = plain_chunk(chunk, self.agent_model, self.keep_logprobs, self.keep_usage)
            if plain is not None:
                data = b"data: " + dumps(plain) + b"\n\n"
                last = self.held or self.cap.finish_reason is not None or self.cap.usage
                (self.held if last else send).append(data)
        return b"".join(send)

    def finish(self) -> tuple[dict, bytes, bytes]:
        """After [DONE]: the captured fields (checked), the held-back tail, and the row's `response`."""
        got = self.cap.result(self.text_only)
        if self.tr is not None:
            tail = self.tr.tail()  # built (not sent) first: it closes the last block that final() reports
            return got, tail, dumps(self.tr.final())
        return got, b"".join(self.held) + b"data: [DONE]\n\n", dumps(self.cap.message(self.agent_model))
