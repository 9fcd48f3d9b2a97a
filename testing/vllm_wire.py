"""vLLM's chat answers on the wire, written from one generated answer (pure: no server).

As vLLM 0.33 writes them with `return_token_ids: true` and `logprobs: true`: `prompt_token_ids`
at the top level (streaming: the first chunk only), `choices[i].token_ids`, one `logprobs.content`
entry per generated id (EOS included), and a final `choices: []` usage chunk when
`stream_options.include_usage` is set. testing/vllm_stub.py serves them.
"""
from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field

from testing.stub_template import EOS_ID, VOCAB


@dataclass
class Reply:
    """One generated answer and how to write it."""

    body: dict  # the request
    fail: str | None  # the injected failure, if any
    gen: dict  # Stub.generate's: ids, words, logprobs, text, tool_call, finish
    prompt_ids: list[int]
    ids: bool  # token ids asked for, from an engine that has them
    lps: bool  # write log-probs
    model: str
    cid: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def usage(self) -> dict:
        n, m = len(self.prompt_ids), len(self.gen["ids"])
        return {"prompt_tokens": n, "total_tokens": n + m, "completion_tokens": m, "prompt_tokens_details": None}


def lp_entry(word: str, lp: float, top: list | None = None) -> dict:
    return {"token": word, "logprob": lp, "bytes": list(word.encode()), "top_logprobs": top or []}


def top_logprobs(body: dict) -> list[dict]:
    """`top_logprobs` alternatives, processed as vLLM's processed_logprobs are: fixed logits
    divided by the temperature, so their gaps double when the temperature halves."""
    n = int(body.get("top_logprobs") or 0)
    if n <= 0:
        return []
    t = float(body.get("temperature") or 1.0)
    scaled = [-k / t for k in range(n)]
    norm = math.log(sum(math.exp(x) for x in scaled))
    return [{"token": VOCAB[k % len(VOCAB)], "logprob": x - norm, "bytes": list(VOCAB[k % len(VOCAB)].encode())}
            for k, x in enumerate(scaled)]


def answer(r: Reply) -> dict:
    """A whole (non-streamed) chat.completion, as vLLM writes it."""
    gen, usage = r.gen, r.usage
    if r.fail == "short_usage":
        usage = {**usage, "completion_tokens": usage["completion_tokens"] + 1}
    message = {"role": "assistant", "content": gen["text"] if not gen["tool_call"] else None,
               "refusal": None, "annotations": None, "audio": None, "function_call": None,
               "tool_calls": [gen["tool_call"]] if gen["tool_call"] else [], "reasoning": None}
    logprobs = {"content": [lp_entry(w, lp, top_logprobs(r.body)) for w, lp in zip(gen["words"], gen["logprobs"])]}
    choice = {"index": 0, "message": message, "logprobs": logprobs if r.lps else None,
              "finish_reason": gen["finish"], "stop_reason": None, "token_ids": gen["ids"] if r.ids and r.fail != "no_token_ids" else None}
    return {"id": r.cid, "object": "chat.completion", "created": r.created, "model": r.model,
            "choices": [choice], "service_tier": None, "system_fingerprint": None, "usage": usage,
            "prompt_logprobs": None, "prompt_token_ids": r.prompt_ids if r.ids and r.fail != "no_token_ids" else None,
            "kv_transfer_params": None}

def stream_chunks(r: Reply) -> list[bytes]:
    """The SSE events of a streamed answer, `data: [DONE]` included."""
    def chunk(choices, **extra) -> bytes:
        obj = {"id": r.cid, "object": "chat.completion.chunk", "created": r.created, "model": r.model,
               "choices": choices, **extra}
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    gen = r.gen
    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    parts = [chunk([first], **({"prompt_token_ids": r.prompt_ids} if r.ids else {}))]
    n, tc = len(gen["ids"]), gen["tool_call"]
    for i, (word, tid, lp) in enumerate(zip(gen["words"], gen["ids"], gen["logprobs"])):
        if tc:  # hermes-style: markup tokens stream with empty deltas, the call comes parsed
            delta = {}
            if i == 0:
                delta = {"tool_calls": [{"index": 0, "id": tc["id"], "type": "function",
                                         "function": {"name": tc["function"]["name"], "arguments": ""}}]}
            elif i == n // 2:
                delta = {"tool_calls": [{"index": 0, "function": {"arguments": tc["function"]["arguments"]}}]}
        else:
            delta = {"content": "" if tid == EOS_ID else word}
        c = {"index": 0, "delta": delta,
             "logprobs": {"content": [lp_entry(word, lp, top_logprobs(r.body))]} if r.lps else None,
             "finish_reason": gen["finish"] if i == n - 1 else None}
        if r.ids and r.fail != "no_token_ids":
            c["token_ids"] = [] if (r.fail == "short_usage" and i == 1) else [tid]
        parts.append(chunk([c]))
    if (r.body.get("stream_options") or {}).get("include_usage"):
        parts.append(chunk([], usage=r.usage))
    parts.append(b"data: [DONE]\n\n")
    if r.fail == "invalid_json":
        parts.insert(2, b'data: {"id": "chatcmpl-x", "choices": [\n\n')
    return parts
