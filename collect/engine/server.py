"""The local engine's HTTP API, shaped like vLLM's OpenAI server (shared/notes/vllm.md).

Routes: /v1/chat/completions (JSON and SSE), /v1/completions, /tokenize, /detokenize,
/v1/models, /health, /v1/load_lora_adapter, /v1/unload_lora_adapter.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import time
import uuid
from typing import Any

from aiohttp import web

from ..config import EngineConfig
from . import model_store
from .batcher import Batcher, Done, Failed, Sequence, Token
from .chat_format import TOOL_OPEN, ChatError, parse_tool_calls, render_prompt_ids
from .errors import APIError, bad_request, internal, not_found, read_json
from .lora import AdapterInvalid, AdapterNotFound, Adapters
from .protocol import check_prompt_len, flag, n_choices, sampling_params

log = logging.getLogger("wharf.engine")


class Engine:
    """Model, tokenizer, adapters and the batcher, plus the request handlers."""

    def __init__(self, cfg: EngineConfig):
        import torch

        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        self.cfg = cfg
        self.model_dir = model_store.resolve_model_dir(cfg.model)
        device = model_store.pick_device(cfg.device)
        model, self.tok = model_store.load_model(self.model_dir, device, cfg.dtype)
        self.max_model_len = min(cfg.max_model_len, getattr(model.config, "max_position_embeddings", 1 << 30))
        gen = model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.tok.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos])
        # Unset sampling fields default to the model's generation_config, as in vLLM.
        self.default_temperature = float(gen.temperature) if gen.do_sample and gen.temperature else 1.0
        self.default_top_p = float(gen.top_p) if gen.do_sample and gen.top_p else 1.0
        self.vocab = len(self.tok)
        self.adapters = Adapters(model, cfg.max_loras)
        self.batcher = Batcher(model, self.tok, max_model_len=self.max_model_len, max_batch=cfg.max_batch,
                               eos_ids=eos_ids, seed=cfg.seed, forward_model=lambda: self.adapters.model,
                               adapter_ok=lambda name: name in self.adapters.paths)
        self.created = int(time.time())

    # -- helpers --------------------------------------------------------------------------------
    @functools.lru_cache(maxsize=65536)
    def token_str(self, tid: int) -> str:
        return self.tok.decode([tid])

    def logprob_entry(self, t: Token) -> dict:
        s = self.token_str(t.token_id)
        return {"token": s, "logprob": t.logprob, "bytes": list(s.encode("utf-8")),
                "top_logprobs": [{"token": self.token_str(j), "logprob": lp,
                                  "bytes": list(self.token_str(j).encode("utf-8"))} for j, lp in t.top]}

    def resolve_model(self, name: Any) -> str | None:
        """The adapter a request's `model` selects (None: the base model)."""
        if name is None or name == self.cfg.served_name:
            return None
        if isinstance(name, str) and name in self.adapters.paths:
            return name
        raise not_found(f"The model `{name}` does not exist.", "model")

    def submit(self, prompt_ids: list[int], params, n: int, adapter: str | None):
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        seqs = []
        for i in range(n):
            p = params if n == 1 or params.seed is None else dataclasses.replace(params, seed=params.seed + i)
            seqs.append(Sequence(list(prompt_ids), p, adapter=adapter,
                                 emit=lambda e, i=i: loop.call_soon_threadsafe(q.put_nowait, (i, e))))
        self.batcher.submit(seqs)
        return seqs, q

    def text_of(self, ids: list[int], stop_reason) -> str:
        text = self.tok.decode(ids, skip_special_tokens=True)
        if isinstance(stop_reason, str) and stop_reason in text:
            text = text[:text.index(stop_reason)]
        return text

    async def collect(self, seqs, q) -> list[tuple[list[Token], Done]]:
        toks: list[list[Token]] = [[] for _ in seqs]
        ends: list[Done | None] = [None] * len(seqs)
        while any(e is None for e in ends):
            i, ev = await q.get()
            if isinstance(ev, Token):
                toks[i].append(ev)
            elif isinstance(ev, Failed):
                raise internal(ev.message)
            else:
                ends[i] = ev
        return list(zip(toks, ends))

    @staticmethod
    def usage(n_prompt: int, n_completion: int) -> dict:
        return {"prompt_tokens": n_prompt, "total_tokens": n_prompt + n_completion,
                "completion_tokens": n_completion, "prompt_tokens_details": None}

    # -- chat -----------------------------------------------------------------------------------
    def parse_chat(self, body: dict):
        model = body.get("model")
        adapter = self.resolve_model(model)
        if "messages" not in body:
            raise bad_request("Field required: 'messages' (a list of {role, content} objects)", "messages")
        tools = body.get("tools") or None
        use_tools = bool(tools) and body.get("tool_choice") != "none"
        try:
            prompt_ids = render_prompt_ids(
                self.tok, body["messages"], tools if use_tools else None,
                add_generation_prompt=flag(body, "add_generation_prompt", True),
                continue_final_message=flag(body, "continue_final_message"),
                chat_template_kwargs=body.get("chat_template_kwargs"))
        except ChatError as e:
            raise bad_request(str(e), "messages") from None
        params = sampling_params(body, len(prompt_ids), self.max_model_len, chat=True,
                                 default_temperature=self.default_temperature, default_top_p=self.default_top_p)
        return (model if adapter else self.cfg.served_name), adapter, prompt_ids, params, use_tools

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        model, adapter, prompt_ids, params, use_tools = self.parse_chat(body)
        n = n_choices(body)
        want_ids, want_lp = flag(body, "return_token_ids"), flag(body, "logprobs")
        seqs, q = self.submit(prompt_ids, params, n, adapter)
        try:
            if flag(body, "stream"):
                opts = body.get("stream_options") or {}
                return await self.chat_stream(request, seqs, q, model, prompt_ids, use_tools, want_ids, want_lp,
                                              bool(isinstance(opts, dict) and opts.get("include_usage")))
            results = await self.collect(seqs, q)
        finally:
            for s in seqs:
                s.cancel()  # no-op for finished ones; frees the batch row if the client went away
        choices, n_out = [], 0
        for i, (toks, done) in enumerate(results):
            ids = [t.token_id for t in toks]
            n_out += len(ids)
            text = self.text_of(ids, done.stop_reason)
            content, calls = parse_tool_calls(text) if use_tools else (text, [])
            choices.append({
                "index": i,
                "message": {"role": "assistant", "content": content, "refusal": None, "annotations": None,
                            "audio": None, "function_call": None, "tool_calls": calls, "reasoning": None},
                "logprobs": {"content": [self.logprob_entry(t) for t in toks]} if want_lp else None,
                "finish_reason": "tool_calls" if calls else done.finish_reason,
                "stop_reason": done.stop_reason,
                "token_ids": ids if want_ids else None,
            })
        return web.json_response({
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": choices, "service_tier": None, "system_fingerprint": None,
            "usage": self.usage(len(prompt_ids), n_out), "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids if want_ids else None, "kv_transfer_params": None,
        })

    async def chat_stream(self, request, seqs, q, model, prompt_ids, use_tools, want_ids, want_lp,
                          include_usage) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        async def send(obj: dict) -> None:
            await resp.write(f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode())

        def chunk(choices: list, **extra) -> dict:
            return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": choices, **extra}

        for i in range(len(seqs)):
            extra = {"prompt_token_ids": prompt_ids} if want_ids and i == 0 else {}
            await send(chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                               "finish_reason": None, "token_ids": [] if want_ids else None}], **extra))
        stops = [s.params.stop for s in seqs]
        ids: list[list[int]] = [[] for _ in seqs]
        sent = [""] * len(seqs)
        pending: list[Token | None] = [None] * len(seqs)
        left, n_out = len(seqs), 0

        def visible(i: int, final: Done | None) -> str:
            """The text that is safe to show: no half characters, stop strings or tool markup."""
            text = self.tok.decode(ids[i], skip_special_tokens=True)
            if final is not None:
                text = self.text_of(ids[i], final.stop_reason)
            else:
                text = text.rstrip("\ufffd")
                hold = max((len(x) for x in stops[i]), default=1) - 1
                if hold > 0:
                    text = text[:-hold] if len(text) > hold else ""
            if use_tools:
                at = text.find(TOOL_OPEN)
                if at >= 0:
                    text = text[:at]
                elif final is None:
                    for k in range(len(TOOL_OPEN) - 1, 0, -1):
                        if text.endswith(TOOL_OPEN[:k]):
                            text = text[:-k]
                            break
            return text

        async def flush(i: int, final: Done | None) -> None:
            t = pending[i]
            pending[i] = None
            delta: dict = {}
            shown = visible(i, final)
            if shown.startswith(sent[i]) and len(shown) > len(sent[i]):
                delta["content"] = shown[len(sent[i]):]
                sent[i] = shown
            reason = final.finish_reason if final else None
            if final is not None and use_tools:
                content, calls = parse_tool_calls(self.text_of(ids[i], final.stop_reason))
                if calls:
                    delta["tool_calls"] = [{"index": j, **c} for j, c in enumerate(calls)]
                    reason = "tool_calls"
                else:  # no call after all: the held-back markup is plain content
                    rest = self.text_of(ids[i], final.stop_reason)
                    if rest.startswith(sent[i]) and len(rest) > len(sent[i]):
                        delta["content"] = delta.get("content", "") + rest[len(sent[i]):]
                        sent[i] = rest
            await send(chunk([{
                "index": i, "delta": delta,
                "logprobs": {"content": [self.logprob_entry(t)]} if want_lp and t else None,
                "finish_reason": reason, "stop_reason": final.stop_reason if final else None,
                "token_ids": ([t.token_id] if t else []) if want_ids else None}]))

        try:
            while left:
                i, ev = await q.get()
                if isinstance(ev, Token):
                    if pending[i] is not None:
                        await flush(i, None)
                    ids[i].append(ev.token_id)
                    pending[i] = ev
                    n_out += 1
                elif isinstance(ev, Failed):
                    await send(internal(ev.message).body())
                    break
                else:
                    await flush(i, ev)
                    left -= 1
            else:
                if include_usage:
                    await send(chunk([], usage=self.usage(len(prompt_ids), n_out)))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            for s in seqs:
                s.cancel()
            raise
        return resp

    # -- completions ----------------------------------------------------------------------------
    def _prompts(self, prompt: Any) -> list[list[int]]:
        def ids_ok(p) -> bool:
            return isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)

        if isinstance(prompt, str):
            return [self.tok.encode(prompt)]
        if ids_ok(prompt):
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or ids_ok(p) for p in prompt):
            prompts = [self.tok.encode(p) if isinstance(p, str) else p for p in prompt]
        else:
            raise bad_request("'prompt' must be a string, a list of token ids, or a list of either", "prompt")
        for p in prompts:
            bad = [t for t in p if not 0 <= t < self.vocab]
            if bad:
                raise bad_request(f"'prompt' holds token ids outside the vocabulary [0, {self.vocab}): {bad[:5]}",
                                  "prompt")
        return prompts

    async def completions(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        adapter = self.resolve_model(body.get("model"))
        model = body["model"] if adapter else self.cfg.served_name
        if "prompt" not in body:
            raise bad_request("Field required: 'prompt'", "prompt")
        if flag(body, "stream"):
            raise bad_request("streaming /v1/completions is not supported by the local engine; "
                              "use /v1/chat/completions or stream=false", "stream")
        prompts = self._prompts(body["prompt"])
        n = n_choices(body)
        want_ids, want_lp = flag(body, "return_token_ids"), body.get("logprobs") is not None
        jobs = []
        for p in prompts:
            params = sampling_params(body, len(p), self.max_model_len, chat=False,
                                     default_temperature=self.default_temperature,
                                     default_top_p=self.default_top_p)
            jobs.append((p, *self.submit(p, params, n, adapter)))
        choices, n_in, n_out = [], 0, 0
        try:
            for k, (p, seqs, q) in enumerate(jobs):
                n_in += len(p)
                for j, (toks, done) in enumerate(await self.collect(seqs, q)):
                    ids = [t.token_id for t in toks]
                    n_out += len(ids)
                    lp = None
                    if want_lp:
                        strs = [self.token_str(t.token_id) for t in toks]
                        offsets, at = [], 0
                        for s in strs:
                            offsets.append(at)
                            at += len(s)
                        lp = {"text_offset": offsets, "token_logprobs": [t.logprob for t in toks], "tokens": strs,
                              "top_logprobs": [{self.token_str(a): b for a, b in t.top} for t in toks]}
                    choices.append({"index": k * n + j, "text": self.text_of(ids, done.stop_reason), "logprobs": lp,
                                    "finish_reason": done.finish_reason, "stop_reason": done.stop_reason,
                                    "prompt_logprobs": None, "prompt_token_ids": p if want_ids else None,
                                    "token_ids": ids if want_ids else None})
        finally:
            for _, seqs, _ in jobs:
                for s in seqs:
                    s.cancel()
        return web.json_response({
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": choices, "service_tier": None, "system_fingerprint": None,
            "usage": self.usage(n_in, n_out), "kv_transfer_params": None})

    # -- tokens, models, health -------------------------------------------------------------------
    async def tokenize(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        self.resolve_model(body.get("model"))
        if "messages" in body:
            try:
                ids = render_prompt_ids(self.tok, body["messages"], body.get("tools") or None,
                                        add_generation_prompt=flag(body, "add_generation_prompt", True),
                                        continue_final_message=flag(body, "continue_final_message"),
                                        chat_template_kwargs=body.get("chat_template_kwargs"))
            except ChatError as e:
                raise bad_request(str(e), "messages") from None
        elif isinstance(body.get("prompt"), str):
            ids = self.tok.encode(body["prompt"], add_special_tokens=flag(body, "add_special_tokens", True))
        else:
            raise bad_request("give 'prompt' (a string) or 'messages'", "prompt")
        strs = self.tok.convert_ids_to_tokens(ids) if flag(body, "return_token_strs") else None
        return web.json_response({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids,
                                  "token_strs": strs})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        self.resolve_model(body.get("model"))
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and 0 <= t < self.vocab for t in ids):
            raise bad_request(f"'tokens' must be a list of token ids in [0, {self.vocab})", "tokens")
        return web.json_response({"prompt": self.tok.decode(ids)})

    async def models(self, request: web.Request) -> web.Response:
        def card(id_, root, parent, max_len):
            return {"id": id_, "object": "model", "created": self.created, "owned_by": "vllm", "root": root,
                    "parent": parent, "max_model_len": max_len,
                    "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                                    "created": self.created, "allow_create_engine": False,
                                    "allow_sampling": True, "allow_logprobs": True,
                                    "allow_search_indices": False, "allow_view": True,
                                    "allow_fine_tuning": False, "organization": "*", "group": None,
                                    "is_blocking": False}]}
        data = [card(self.cfg.served_name, str(self.model_dir), None, self.max_model_len)]
        data += [card(n, p, self.cfg.served_name, None) for n, p in self.adapters.paths.items()]
        return web.json_response({"object": "list", "data": data})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def stats(self, request: web.Request) -> web.Response:
        """Not in vLLM: batching counters for tests and the benchmark."""
        b = self.batcher
        return web.json_response({"decode_steps": b.steps, "peak_batch": b.peak_batch, "running": len(b.running),
                                  "generated_tokens": b.generated, "adapters": sorted(self.adapters.paths)})

    # -- LoRA -------------------------------------------------------------------------------------
    async def load_lora(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path or not isinstance(name, str) or not isinstance(path, str):
            raise APIError("Both 'lora_name' and 'lora_path' must be provided.", 400, "InvalidUserInput")
        inplace = bool(body.get("load_inplace", False))
        if not inplace and name in self.adapters.paths:
            raise APIError(f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                           "in place, set 'load_inplace' to True.", 400, "InvalidUserInput")
        try:
            await asyncio.wrap_future(self.batcher.call(lambda: self.adapters.load(name, path, inplace)))
        except AdapterNotFound as e:
            raise not_found(str(e)) from None
        except AdapterInvalid as e:
            raise internal(str(e)) from None
        log.info("loaded LoRA adapter %s from %s", name, path)
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        name = body.get("lora_name")
        if not name or not isinstance(name, str):
            raise APIError("'lora_name' needs to be provided to unload a LoRA adapter.", 400, "InvalidUserInput")
        if name not in self.adapters.paths:
            raise not_found(f"The lora adapter '{name}' cannot be found.")

        def unload():
            self.batcher.fail_adapter(name, f"the LoRA adapter '{name}' was unloaded")
            self.adapters.unload(name)

        await asyncio.wrap_future(self.batcher.call(unload))
        log.info("unloaded LoRA adapter %s", name)
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")


@web.middleware
async def errors_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except APIError as e:
        return e.response()
    except web.HTTPException as e:
        if e.status >= 400:
            return APIError(e.reason or str(e), e.status, "NotFoundError" if e.status == 404 else "BadRequestError"
                            ).response()
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as e:
        log.exception("request failed")
        return internal(f"{type(e).__name__}: {e}").response()


def make_app(engine: Engine) -> web.Application:
    app = web.Application(middlewares=[errors_middleware], client_max_size=256 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", engine.chat)
    app.router.add_post("/v1/completions", engine.completions)
    app.router.add_post("/tokenize", engine.tokenize)
    app.router.add_post("/detokenize", engine.detokenize)
    app.router.add_get("/v1/models", engine.models)
    app.router.add_get("/health", engine.health)
    app.router.add_get("/stats", engine.stats)
    app.router.add_post("/v1/load_lora_adapter", engine.load_lora)
    app.router.add_post("/v1/unload_lora_adapter", engine.unload_lora)

    async def lifecycle(app):
        engine.batcher.start()
        yield
        engine.batcher.stop()

    app.cleanup_ctx.append(lifecycle)
    return app
