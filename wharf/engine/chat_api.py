"""/v1/chat/completions as vLLM's OpenAI server answers it: one JSON answer, or SSE chunks.

With `return_token_ids` the answer carries `prompt_token_ids` (top level; in a stream, in the
first chunk) and each choice (or chunk) its `token_ids`; `logprobs` are the processed ones.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid

from aiohttp import web

from .sequence import Done, Failed, Token
from .chat_format import ChatError
from .core import EngineCore
from .errors import bad_request, internal, read_json
from .protocol import flag, n_choices, sampling_params, usage


def parse_chat(core: EngineCore, body: dict):
    """The served model name, adapter, prompt ids, sampling params and whether tools are on."""
    model = body.get("model")
    adapter = core.adapter_for(model)
    if "messages" not in body:
        raise bad_request("Field required: 'messages' (a list of {role, content} objects)", "messages")
    tools = body.get("tools") or None
    use_tools = bool(tools) and body.get("tool_choice") != "none"
    try:
        prompt_ids = core.chat_prompt_ids(body, tools if use_tools else None)
    except ChatError as e:
        raise bad_request(str(e), "messages") from None
    params = sampling_params(body, len(prompt_ids), core.max_model_len, chat=True,
                             default_temperature=core.default_temperature, default_top_p=core.default_top_p)
    return (model if adapter else core.cfg.served_name), adapter, prompt_ids, params, use_tools


async def chat(core: EngineCore, request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    model, adapter, prompt_ids, params, use_tools = parse_chat(core, body)
    n = n_choices(body)
    want_ids, want_lp = flag(body, "return_token_ids"), flag(body, "logprobs")
    seqs, q = core.submit(prompt_ids, params, n, adapter)
    try:
        if flag(body, "stream"):
            opts = body.get("stream_options") or {}
            streamer = ChatStreamer(core, seqs, model, prompt_ids, use_tools, want_ids, want_lp)
            return await streamer.run(request, q, bool(isinstance(opts, dict) and opts.get("include_usage")))
        results = await core.collect(seqs, q)
    finally:
        for s in seqs:
            s.cancel()  # no-op for finished ones; frees the batch row if the client went away
    choices, n_out, parser = [], 0, core.tool_parser
    for i, (toks, done) in enumerate(results):
        ids = [t.token_id for t in toks]
        n_out += len(ids)
        text = core.answer_text(ids, done, use_tools and parser.keep_special)
        content, calls = parser.parse(text) if use_tools else (text, [])
        choices.append({
            "index": i,
            "message": {"role": "assistant", "content": content, "refusal": None, "annotations": None,
                        "audio": None, "function_call": None, "tool_calls": calls, "reasoning": None},
            "logprobs": {"content": [core.logprob_entry(t) for t in toks]} if want_lp else None,
            "finish_reason": "tool_calls" if calls else done.finish_reason,
            "stop_reason": done.stop_reason,
            "token_ids": ids if want_ids else None,
        })
    return web.json_response({
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": model, "choices": choices, "service_tier": None, "system_fingerprint": None,
        "usage": usage(len(prompt_ids), n_out), "prompt_logprobs": None,
        "prompt_token_ids": prompt_ids if want_ids else None, "kv_transfer_params": None,
    })


class ChatStreamer:
    """One streamed chat answer: a chunk per token, text held back while it may still be a stop
    string, half a character or the start of a tool call in the engine's format (its parser's
    hold_from); the finish chunk carries any tool calls."""

    def __init__(self, core: EngineCore, seqs, model: str, prompt_ids: list[int], use_tools: bool,
                 want_ids: bool, want_lp: bool):
        self.core, self.seqs, self.model, self.prompt_ids = core, seqs, model, prompt_ids
        self.use_tools, self.want_ids, self.want_lp = use_tools, want_ids, want_lp
        self.parser = core.tool_parser
        self.keep_special = use_tools and self.parser.keep_special
        self.rid, self.created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        self.stops = [s.params.stop for s in seqs]
        self.ids: list[list[int]] = [[] for _ in seqs]
        self.sent = [""] * len(seqs)
        self.pending: list[Token | None] = [None] * len(seqs)
        self.resp: web.StreamResponse | None = None

    async def send(self, obj: dict) -> None:
        await self.resp.write(f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode())

    def chunk(self, choices: list, **extra) -> dict:
        return {"id": self.rid, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": choices, **extra}

    def visible(self, i: int, final: Done | None) -> str:
        """The text that is safe to show: no half characters, stop strings or tool markup."""
        if final is not None:
            text = self.core.answer_text(self.ids[i], final, self.keep_special)
        else:
            text = self.core.tok.decode(self.ids[i], skip_special_tokens=not self.keep_special).rstrip("\ufffd")
            hold = max((len(x) for x in self.stops[i]), default=1) - 1
            if hold > 0:
                text = text[:-hold] if len(text) > hold else ""
        if self.use_tools:
            text = text[:self.parser.hold_from(text, final is not None)]
        return text

    def _grow(self, i: int, delta: dict, shown: str) -> None:
        """Add what `shown` has beyond what was sent to the delta's content."""
        if shown.startswith(self.sent[i]) and len(shown) > len(self.sent[i]):
            delta["content"] = delta.get("content", "") + shown[len(self.sent[i]):]
            self.sent[i] = shown

    async def flush(self, i: int, final: Done | None) -> None:
        t = self.pending[i]
        self.pending[i] = None
        delta: dict = {}
        self._grow(i, delta, self.visible(i, final))
        reason = final.finish_reason if final else None
        if final is not None and self.use_tools:
            text = self.core.answer_text(self.ids[i], final, self.keep_special)
            _, calls = self.parser.parse(text)
            if calls:
                delta["tool_calls"] = [{"index": j, **c} for j, c in enumerate(calls)]
                reason = "tool_calls"
            else:  # no call after all: the held-back markup is plain content
                self._grow(i, delta, text)
        await self.send(self.chunk([{
            "index": i, "delta": delta,
            "logprobs": {"content": [self.core.logprob_entry(t)]} if self.want_lp and t else None,
            "finish_reason": reason, "stop_reason": final.stop_reason if final else None,
            "token_ids": ([t.token_id] if t else []) if self.want_ids else None}]))

    async def run(self, request: web.Request, q: asyncio.Queue, include_usage: bool) -> web.StreamResponse:
        self.resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await self.resp.prepare(request)
        for i in range(len(self.seqs)):
            extra = {"prompt_token_ids": self.prompt_ids} if self.want_ids and i == 0 else {}
            await self.send(self.chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                         "finish_reason": None, "token_ids": [] if self.want_ids else None}],
                                       **extra))
        left, n_out = len(self.seqs), 0
        try:
            while left:
                i, ev = await q.get()
                if isinstance(ev, Token):
                    if self.pending[i] is not None:
                        await self.flush(i, None)
                    self.ids[i].append(ev.token_id)
                    self.pending[i] = ev
                    n_out += 1
                elif isinstance(ev, Failed):
                    await self.send(internal(ev.message).body())
                    break
                else:
                    await self.flush(i, ev)
                    left -= 1
            else:
                if include_usage:
                    await self.send(self.chunk([], usage=usage(len(self.prompt_ids), n_out)))
            await self.resp.write(b"data: [DONE]\n\n")
            await self.resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            for s in self.seqs:
                s.cancel()
            raise
        return self.resp
