"""/v1/completions (not streamed) as vLLM answers it: prompts as text or token ids, n samples each."""
from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from .sequence import Token
from .core import EngineCore
from .errors import bad_request, read_json
from .protocol import flag, n_choices, sampling_params, usage


def prompt_ids(core: EngineCore, prompt: Any) -> list[list[int]]:
    """A string, a list of token ids, or a list of either -> one id list per prompt."""
    def ids_ok(p) -> bool:
        return isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)

    if isinstance(prompt, str):
        return [core.tok.encode(prompt)]
    if ids_ok(prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or ids_ok(p) for p in prompt):
        prompts = [core.tok.encode(p) if isinstance(p, str) else p for p in prompt]
    else:
        raise bad_request("'prompt' must be a string, a list of token ids, or a list of either", "prompt")
    for p in prompts:
        bad = [t for t in p if not 0 <= t < core.vocab]
        if bad:
            raise bad_request(f"'prompt' holds token ids outside the vocabulary [0, {core.vocab}): {bad[:5]}",
                              "prompt")
    return prompts


def _logprobs(core: EngineCore, toks: list[Token]) -> dict:
    strs = [core.token_str(t.token_id) for t in toks]
    offsets, at = [], 0
    for s in strs:
        offsets.append(at)
        at += len(s)
    return {"text_offset": offsets, "token_logprobs": [t.logprob for t in toks], "tokens": strs,
            "top_logprobs": [{core.token_str(a): b for a, b in t.top} for t in toks]}


async def completions(core: EngineCore, request: web.Request) -> web.Response:
    body = await read_json(request)
    adapter = core.adapter_for(body.get("model"))
    model = body["model"] if adapter else core.cfg.served_name
    if "prompt" not in body:
        raise bad_request("Field required: 'prompt'", "prompt")
    if flag(body, "stream"):
        raise bad_request("streaming /v1/completions is not supported by the local engine; "
                          "use /v1/chat/completions or stream=false", "stream")
    prompts = prompt_ids(core, body["prompt"])
    n = n_choices(body)
    want_ids, want_lp = flag(body, "return_token_ids"), body.get("logprobs") is not None
    jobs = []
    for p in prompts:
        params = sampling_params(body, len(p), core.max_model_len, chat=False,
                                 default_temperature=core.default_temperature, default_top_p=core.default_top_p)
        jobs.append((p, *core.submit(p, params, n, adapter)))
    choices, n_in, n_out = [], 0, 0
    try:
        for k, (p, seqs, q) in enumerate(jobs):
            n_in += len(p)
            for j, (toks, done) in enumerate(await core.collect(seqs, q)):
                ids = [t.token_id for t in toks]
                n_out += len(ids)
                choices.append({"index": k * n + j, "text": core.text_of(ids, done.stop_reason),
                                "logprobs": _logprobs(core, toks) if want_lp else None,
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
        "usage": usage(n_in, n_out), "kv_transfer_params": None})
