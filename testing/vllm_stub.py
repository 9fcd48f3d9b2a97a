"""A fast stand-in for vLLM's /v1/chat/completions, speaking its wire format with token ids.

It answers the way vLLM 0.33 does with `return_token_ids: true` and `logprobs: true`
(testing/vllm_wire.py writes the answers). Tokens come from a toy word-level tokenizer, so ids
are deterministic for a given prompt and `seed`.

Error injection, for the proxy's tests and benchmark:
- `error_rate` (0..1): that fraction of requests fails, the kind drawn from `error_kinds`;
- a request body field `stub_fail: <kind>` forces one; `stub_delay: <seconds>` delays the answer,
  `stub_chunk_delay: <seconds>` each chunk of a stream;
- `hold=predicate`: a chat call whose body it accepts waits until `release()` (`held` counts
  those waiting): some rollouts of a round kept unfinished, whatever the machine's load.
Kinds: 500 | 503 | 400 (HTTP errors with an OpenAI error body), invalid_json, no_token_ids,
drop (closes the connection; in streaming after a few chunks), short_usage (ids that do not add
up to usage: one id missing from a stream, or usage one higher in a full answer).

Scripted agent runs (`script="shell:<command>"`): while the conversation holds no tool result,
the answer calls the shell tool of whatever agent is asking (the tool
whose schema takes a `command`/`cmd` string: claude-code's Bash, codex's exec_command, ...) with
<command>; after the result comes back, a short final text. A pure function of the conversation, so
concurrent rollouts each get their two turns.

`max_model_len`: /v1/models reports it, /tokenize counts a prompt as vLLM's does, and a request
whose prompt plus max_tokens does not fit is refused with vLLM's wording.

`teacher=True`: an API model's server (OpenAI's, llama.cpp's, ollama's) instead: a request with
one of vLLM's own parameters (return_token_ids, top_k, ...) is refused 400 as OpenAI refuses an
unknown argument, and answers carry no token ids or log-probs.

`python -m testing.vllm_stub --port 8199 [--error-rate 0.05]`, or `StubServer().start()` in a thread.
GET /stub/stats counts what was served; GET /stub/requests returns the last bodies received.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import threading
import uuid
import zlib
from typing import Callable

from aiohttp import web

from testing.app_thread import AppThread

from wharf.engine.auth import auth_middleware

from testing.stub_template import EOS_ID, VOCAB, WORD, render_prompt, tool_call_text, word_id
from testing.vllm_wire import Reply, answer, stream_chunks

ERROR_KINDS = ("500", "503", "400", "invalid_json", "no_token_ids", "drop", "short_usage")
# What an OpenAI-only server refuses: vLLM's extensions of the chat request.
VLLM_ONLY = ("return_token_ids", "top_k", "min_p", "repetition_penalty", "prompt_logprobs")


def _error_body(status: int, message: str) -> dict:
    kind = {400: "BadRequestError", 503: "ServiceUnavailableError"}.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


class Stub:
    def __init__(self, error_rate: float = 0.0, seed: int = 0, error_kinds=ERROR_KINDS,
                 completion_tokens: int = 16, model: str = "stub-model", keep_requests: int = 200,
                 script: str | None = None, max_model_len: int | None = None, api_key: str | None = None,
                 loras: bool = False, teacher: bool = False, hold: Callable[[dict], bool] | None = None):
        """`loras`: serve runtime LoRA loading as vLLM does (/v1/load_lora_adapter, /v1/models listing
        each adapter with its root) and answer a call for a model it does not serve with vLLM's 404."""
        if script is not None and not script.startswith("shell:"):
            raise ValueError(f"stub script {script!r}: expected 'shell:<command>'")
        self.script = script
        self.teacher = teacher
        self.api_key = api_key  # set: /v1 routes need it, as vLLM --api-key
        self.max_model_len = max_model_len
        self.error_rate = error_rate
        self.error_kinds = tuple(error_kinds)
        self.rng = random.Random(seed)
        self.completion_tokens = completion_tokens
        self.model = model
        self.stats = collections.Counter()
        self.requests: collections.deque = collections.deque(maxlen=keep_requests)
        self.loras = loras
        self.adapters: dict[str, str] = {}  # runtime-loaded LoRAs: name -> path
        self.hold = hold
        self.held = 0  # chat calls waiting for release() now
        self._released = threading.Event()

    def release(self) -> None:
        """Let the held chat calls (and every later one) through."""
        self._released.set()

    async def _hold(self, body: dict) -> None:
        if self.hold is None or self._released.is_set() or not self.hold(body):
            return
        self.held += 1
        try:
            while not self._released.is_set():  # a thread's event: release() comes from the test's thread
                await asyncio.sleep(0.05)
        finally:
            self.held -= 1

    def restart(self) -> None:
        """What a vLLM restart does to runtime-loaded LoRAs: forgets them."""
        self.adapters.clear()

    # -- generation -------------------------------------------------------------------------
    def _scripted(self, body: dict) -> tuple[dict | None, str | None]:
        """(tool, arguments) for the shell call, or (None, None) for the final answer (script mode)."""
        if any(m.get("role") == "tool" for m in body.get("messages") or ()):
            return None, None
        for t in body.get("tools") or ():
            fn = t.get("function", {})
            props = (fn.get("parameters") or {}).get("properties") or {}
            key = next((k for k in ("command", "cmd") if (props.get(k) or {}).get("type") == "string"), None)
            if key:
                return fn, json.dumps({key: self.script.split(":", 1)[1]})
        return None, None

    def generate(self, body: dict, prompt_ids: list[int]) -> dict:
        """A completion: text or a tool call, its ids (EOS last unless cut by max_tokens), logprobs."""
        seed = body.get("seed")
        rng = random.Random(f"{seed}:{zlib.crc32(bytes(str(prompt_ids), 'ascii'))}") if seed is not None else self.rng
        limit = body.get("max_tokens") or body.get("max_completion_tokens") or 1 << 30
        tools = body.get("tools")
        last = (body.get("messages") or [{}])[-1]
        tool_call = None
        fn, args = self._scripted(body) if self.script else (None, None)
        if fn is None and not self.script and tools and last.get("role") == "user":
            fn = tools[0].get("function", {})
            args = json.dumps({"command": "ls " + rng.choice(VOCAB).strip()})
        if fn is not None:
            tool_call = {"id": f"chatcmpl-tool-{uuid.uuid4().hex[:16]}", "type": "function",
                         "function": {"name": fn.get("name", "tool"), "arguments": args}}
            words = WORD.findall(tool_call_text(fn.get("name", "tool"), args))
        elif self.script:
            words = WORD.findall("Done: the command ran.")
        else:
            words = [rng.choice(VOCAB) for _ in range(min(limit, self.completion_tokens))]
        finish = "tool_calls" if tool_call else "stop"
        if len(words) >= limit:
            words, finish = words[:limit], "length"
        ids = [word_id(w) for w in words]
        if finish != "length":
            ids.append(EOS_ID)
            words = words + ["<|im_end|>"]
        lps = [-round(rng.random() * 4, 4) for _ in ids]
        return {"words": words, "ids": ids, "logprobs": lps, "finish": finish, "tool_call": tool_call,
                "text": "" if tool_call else "".join(words[: len(words) - (finish != "length")])}

    # -- handlers ---------------------------------------------------------------------------
    def _pick_failure(self, body: dict) -> str | None:
        forced = body.get("stub_fail")
        if forced:
            return str(forced)
        if self.error_rate and self.rng.random() < self.error_rate:
            return self.rng.choice(self.error_kinds)
        return None

    async def chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            return web.json_response(_error_body(400, "invalid JSON body"), status=400)
        self.requests.append(body)
        self.stats["requests"] += 1
        await self._hold(body)
        refused = await self._refusal(body)
        if refused is not None:
            return refused
        fail = self._pick_failure(body)
        if fail:
            self.stats[f"error:{fail}"] += 1
        if fail in ("500", "503", "400"):
            return web.json_response(_error_body(int(fail), f"injected {fail}"), status=int(fail))
        if fail == "invalid_json" and not body.get("stream"):
            return web.Response(body=b'{"id": "chatcmpl-x", "choices": [', content_type="application/json")
        if fail == "drop" and not body.get("stream"):
            request.transport.close()  # the client sees the connection drop without an answer
            return web.Response(status=500)
        prompt_ids = render_prompt(body.get("messages") or [], body.get("tools"))
        too_long = self._check_len(len(prompt_ids), body)
        if too_long:
            self.stats["error:context"] += 1
            return web.json_response(_error_body(400, too_long), status=400)
        r = Reply(body, fail, self.generate(body, prompt_ids), prompt_ids,
                  ids=bool(body.get("return_token_ids")) and not self.teacher,
                  lps=bool(body.get("logprobs")) and not self.teacher, model=body.get("model") or self.model)
        if body.get("stream"):
            return await self._stream(request, r)
        if not fail:
            self.stats["ok"] += 1
        return web.Response(body=json.dumps(answer(r)).encode(), content_type="application/json")

    async def _refusal(self, body: dict) -> web.Response | None:
        """What vLLM (or an OpenAI-only teacher) refuses before generating: a model it does not
        serve, an argument it does not know; `stub_delay` waits first."""
        if self.loras and body.get("model") not in (self.model, *self.adapters):
            self.stats["missing_model"] += 1
            return web.json_response({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                                "type": "NotFoundError", "param": None, "code": 404}}, status=404)
        self.stats[f"model:{body.get('model')}"] += 1
        if body.get("stub_delay"):
            await asyncio.sleep(float(body["stub_delay"]))
        unknown = [k for k in VLLM_ONLY if k in body] if self.teacher else []
        if unknown:
            self.stats["error:unrecognized"] += 1
            return web.json_response(_error_body(400, f"Unrecognized request argument supplied: {unknown[0]}"),
                                     status=400)
        return None

    async def _stream(self, request: web.Request, r: Reply) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        parts = stream_chunks(r)
        if r.fail == "drop":
            for p in parts[:3]:
                await resp.write(p)
            request.transport.close()
            return resp
        if not r.fail:
            self.stats["ok"] += 1
        if r.body.get("stub_chunk_delay"):  # a slow generation: the agent can leave mid-stream
            try:
                for p in parts:
                    await resp.write(p)
                    await asyncio.sleep(float(r.body["stub_chunk_delay"]))
            except ConnectionResetError:  # the caller aborted the generation, as vLLM allows
                return resp
        else:
            await resp.write(b"".join(parts))
        await resp.write_eof()
        return resp

    def _check_len(self, n_prompt: int, body: dict) -> str | None:
        """vLLM's refusal of a prompt (plus max_tokens) over max_model_len, in its words; None if it fits."""
        if self.max_model_len is None:
            return None
        limit = self.max_model_len
        if n_prompt >= limit:
            return (f"This model's maximum context length is {limit} tokens. However, your request has {n_prompt} "
                    "input tokens. Please reduce the length of the input messages.")
        want = body.get("max_tokens") or body.get("max_completion_tokens")
        if want is not None and want > limit - n_prompt:
            return (f"'max_tokens' or 'max_completion_tokens' is too large: {want}. This model's maximum context "
                    f"length is {limit} tokens and your request has {n_prompt} input tokens "
                    f"({want} > {limit} - {n_prompt}).")
        return None

    async def tokenize(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        ids = render_prompt(body.get("messages") or [], body.get("tools"))
        return web.json_response({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids,
                                  "token_strs": None})

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "created": 0, "owned_by": "vllm", "root": self.model}
        if self.max_model_len is not None:
            card["max_model_len"] = self.max_model_len
        cards = [card] + [{"id": n, "object": "model", "created": 0, "owned_by": "vllm", "root": path,
                           "parent": self.model} for n, path in self.adapters.items()]
        return web.json_response({"object": "list", "data": cards})

    async def load_lora(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        name = body.get("lora_name")
        if name in self.adapters:
            return web.json_response(_error_body(400, f"The lora adapter '{name}' has already been loaded."),
                                     status=400)
        self.adapters[name] = body.get("lora_path")
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def completion(self, request: web.Request) -> web.Response:
        """/v1/completions, as far as publish's check needs it: a word for a model it serves."""
        model = json.loads(await request.read()).get("model")
        if model not in (self.model, *self.adapters):
            return web.json_response({"error": {"message": f"The model `{model}` does not exist.",
                                                "type": "NotFoundError", "param": None, "code": 404}}, status=404)
        return web.json_response({"id": "cmpl-stub", "object": "text_completion", "model": model,
                                  "choices": [{"index": 0, "text": " ok", "finish_reason": "length"}]})

    async def unload_lora(self, request: web.Request) -> web.Response:
        name = json.loads(await request.read()).get("lora_name")
        if self.adapters.pop(name, None) is None:
            return web.json_response({"error": {"message": f"The lora adapter '{name}' cannot be found.",
                                                "type": "NotFoundError", "param": None, "code": 404}}, status=404)
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def get_stats(self, request: web.Request) -> web.Response:
        return web.json_response(dict(self.stats))

    async def get_requests(self, request: web.Request) -> web.Response:
        return web.json_response(list(self.requests))

    def app(self) -> web.Application:
        auth = [auth_middleware(self.api_key)] if self.api_key else []
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=auth)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        if self.loras:
            app.router.add_post("/v1/load_lora_adapter", self.load_lora)
            app.router.add_post("/v1/unload_lora_adapter", self.unload_lora)
            app.router.add_post("/v1/completions", self.completion)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_get("/health", self.health)
        app.router.add_get("/stub/stats", self.get_stats)
        app.router.add_get("/stub/requests", self.get_requests)
        return app


class StubServer(AppThread):
    """The stub on its own event loop in a daemon thread (tests): `url` once started."""

    def __init__(self, port: int = 0, **kwargs):
        self.stub = Stub(**kwargs)
        super().__init__(self.stub.app, port, "vllm-stub")

    def stop(self) -> None:
        self.stub.release()  # held calls answer, so that the server's shutdown need not wait on them
        super().stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m testing.vllm_stub", description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8199)
    p.add_argument("--error-rate", type=float, default=0.0)
    p.add_argument("--error-kinds", default=",".join(ERROR_KINDS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--completion-tokens", type=int, default=16)
    p.add_argument("--script", default=None, help="shell:<command>: call the agent's shell tool once, then answer")
    p.add_argument("--max-model-len", type=int, default=None)
    args = p.parse_args(argv)
    stub = Stub(error_rate=args.error_rate, seed=args.seed, error_kinds=args.error_kinds.split(","),
                completion_tokens=args.completion_tokens, script=args.script, max_model_len=args.max_model_len)
    print(f"vllm stub listening on http://127.0.0.1:{args.port}", flush=True)
    web.run_app(stub.app(), host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
