"""The local engine's HTTP API, shaped like vLLM's OpenAI server.

Routes: /v1/chat/completions (JSON and SSE, chat_api.py), /v1/completions (completions_api.py),
/tokenize, /detokenize, /v1/models, /health, /metrics (Prometheus text, metrics.py), /stats, /v1/load_lora_adapter, /v1/unload_lora_adapter.
The model side (model, tokenizer, adapters, batcher) is core.py's EngineCore. With
engine.api_key set, /v1 routes need it as vLLM's --api-key does (auth_middleware).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import uuid

from aiohttp import web

from wharf.core.config import EngineConfig
from . import chat_api, completions_api
from .auth import auth_middleware
from .chat_format import ChatError
from .core import EngineCore
from .metrics import metrics_text, prefix_stats
from .errors import APIError, bad_request, internal, not_found, read_json
from wharf.core.adapters import AdapterInvalid, AdapterNotFound
from .protocol import flag

log = logging.getLogger("wharf.engine")


class Engine:
    """The HTTP handlers over one EngineCore."""

    def __init__(self, cfg: EngineConfig, core: EngineCore | None = None):
        self.cfg = cfg
        self.core = core or EngineCore(cfg)
        self.model_dir = self.core.model_dir
        self.chat = functools.partial(chat_api.chat, self.core)
        self.completions = functools.partial(completions_api.completions, self.core)

    # -- tokens, models, health -------------------------------------------------------------------
    async def tokenize(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        self.core.adapter_for(body.get("model"))
        if "messages" in body:
            try:
                ids = self.core.chat_prompt_ids(body, body.get("tools") or None)
            except ChatError as e:
                raise bad_request(str(e), "messages") from None
        elif isinstance(body.get("prompt"), str):
            ids = self.core.tok.encode(body["prompt"], add_special_tokens=flag(body, "add_special_tokens", True))
        else:
            raise bad_request("give 'prompt' (a string) or 'messages'", "prompt")
        strs = self.core.tok.convert_ids_to_tokens(ids) if flag(body, "return_token_strs") else None
        return web.json_response({"count": len(ids), "max_model_len": self.core.max_model_len, "tokens": ids,
                                  "token_strs": strs})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        self.core.adapter_for(body.get("model"))
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and 0 <= t < self.core.vocab for t in ids):
            raise bad_request(f"'tokens' must be a list of token ids in [0, {self.core.vocab})", "tokens")
        return web.json_response({"prompt": self.core.tok.decode(ids)})

    async def models(self, request: web.Request) -> web.Response:
        def card(id_, root, parent, max_len):
            return {"id": id_, "object": "model", "created": self.core.created, "owned_by": "vllm", "root": root,
                    "parent": parent, "max_model_len": max_len,
                    "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                                    "created": self.core.created, "allow_create_engine": False,
                                    "allow_sampling": True, "allow_logprobs": True,
                                    "allow_search_indices": False, "allow_view": True,
                                    "allow_fine_tuning": False, "organization": "*", "group": None,
                                    "is_blocking": False}]}
        # The root is what the model was given as (a dir, or a hub id), as vLLM reports its model argument.
        data = [card(self.cfg.served_name, self.cfg.model or str(self.model_dir), None, self.core.max_model_len)]
        data += [card(n, p, self.cfg.served_name, None) for n, p in self.core.adapters.paths.items()]
        return web.json_response({"object": "list", "data": data})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def stats(self, request: web.Request) -> web.Response:
        """Not in vLLM: batching counters for tests and the benchmark."""
        b = self.core.batcher
        return web.json_response({"decode_steps": b.steps, "peak_batch": b.peak_batch, "running": len(b.running),
                                  "generated_tokens": b.generated, "adapters": sorted(self.core.adapters.paths),
                                  "prefix_cache": prefix_stats(self.core.prefix)})

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus text, with vLLM's names where vLLM has the figure."""
        return web.Response(text=metrics_text(self.cfg.served_name, self.core.batcher, self.core.prefix),
                            content_type="text/plain", charset="utf-8")

    # -- LoRA -------------------------------------------------------------------------------------
    async def load_lora(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path or not isinstance(name, str) or not isinstance(path, str):
            raise APIError("Both 'lora_name' and 'lora_path' must be provided.", 400, "InvalidUserInput")
        inplace = bool(body.get("load_inplace", False))
        if not inplace and name in self.core.adapters.paths:
            raise APIError(f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                           "in place, set 'load_inplace' to True.", 400, "InvalidUserInput")
        try:
            await asyncio.wrap_future(self.core.batcher.call(lambda: self.core.adapters.load(name, path, inplace)))
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
        if name not in self.core.adapters.paths:
            raise not_found(f"The lora adapter '{name}' cannot be found.")

        def unload():
            self.core.batcher.fail_adapter(name, f"the LoRA adapter '{name}' was unloaded")
            self.core.adapters.unload(name)

        await asyncio.wrap_future(self.core.batcher.call(unload))
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


ROUTES = (  # method, path, Engine handler
    ("POST", "/v1/chat/completions", "chat"), ("POST", "/v1/completions", "completions"),
    ("POST", "/tokenize", "tokenize"), ("POST", "/detokenize", "detokenize"), ("GET", "/v1/models", "models"),
    ("GET", "/health", "health"), ("GET", "/stats", "stats"), ("GET", "/metrics", "metrics"),
    ("POST", "/v1/load_lora_adapter", "load_lora"), ("POST", "/v1/unload_lora_adapter", "unload_lora"),
)


def make_app(engine: Engine) -> web.Application:
    auth = [auth_middleware(engine.cfg.api_key)] if engine.cfg.api_key else []
    app = web.Application(middlewares=[*auth, errors_middleware], client_max_size=256 * 1024 * 1024)
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, getattr(engine, handler))

    async def lifecycle(app):
        engine.core.batcher.start()
        yield
        engine.core.batcher.stop()

    app.cleanup_ctx.append(lifecycle)
    return app
