"""The local engine through the real openai client: ids, processed log-probs, streaming, tools, batching."""
from __future__ import annotations

import concurrent.futures
import json

import pytest
import torch
from openai import OpenAI

from wharf.core import model_store

EOT = "<|im_end|>"
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
# Greedy SmolLM2 copies this into a well-formed hermes tool call (checked by hand).
TOOL_PROMPT = 'Repeat exactly this text: <tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'


@pytest.fixture(scope="module")
def client(engine_url):
    return OpenAI(base_url=f"{engine_url}/v1", api_key="EMPTY", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def ref(engine_url):
    """The same model in this process, for separate forward passes."""
    torch.set_num_threads(2)
    model, tok = model_store.load_model(model_store.embedded_model_dir(), "cpu", "float32")
    return model, tok


def ref_logprobs(ref, prompt_ids, ids, temperature):
    model, _ = ref
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + ids])).logits[0].float()
    t = temperature if temperature > 0 else 1.0
    lp = torch.log_softmax(logits / t, dim=-1)
    p = len(prompt_ids)
    return [float(lp[p + k - 1, tid]) for k, tid in enumerate(ids)]


def chat(client, messages, stream=False, **kw):
    """One chat call; streaming ones are folded into the shape of a non-streaming answer."""
    body = dict(model="smollm2-135m", messages=messages, logprobs=True,
                extra_body={"return_token_ids": True, **kw.pop("extra_body", {})}, **kw)
    if not stream:
        r = client.chat.completions.create(**body)
        c = r.choices[0]
        return {"prompt_ids": r.model_extra["prompt_token_ids"], "ids": c.model_extra["token_ids"],
                "content": c.message.content, "tool_calls": c.message.tool_calls or [],
                "logprobs": [e.logprob for e in c.logprobs.content], "finish": c.finish_reason,
                "usage": r.usage.completion_tokens, "n_chunks": 0}
    out = {"prompt_ids": None, "ids": [], "content": "", "tool_calls": [], "logprobs": [], "finish": None,
           "usage": None, "n_chunks": 0}
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **body):
        extra = chunk.model_extra or {}
        if out["prompt_ids"] is None:
            out["prompt_ids"] = extra.get("prompt_token_ids")
        else:
            assert "prompt_token_ids" not in extra or extra["prompt_token_ids"] is None
        if not chunk.choices:
            out["usage"] = chunk.usage.completion_tokens
            continue
        c = chunk.choices[0]
        out["n_chunks"] += 1
        out["ids"] += c.model_extra["token_ids"]
        out["content"] += c.delta.content or ""
        out["tool_calls"] += c.delta.tool_calls or []
        if c.logprobs:
            out["logprobs"] += [e.logprob for e in c.logprobs.content]
        out["finish"] = c.finish_reason or out["finish"]
    return out


def check_invariants(r, ref, tok, temperature):
    ids = r["ids"]
    assert len(ids) == len(r["logprobs"]) == r["usage"] >= 1
    decoded = tok.decode(ids)
    if r["tool_calls"]:
        assert r["finish"] == "tool_calls"
        assert "<tool_call>" in decoded and decoded.endswith(EOT)
        assert decoded.startswith(r["content"] or "")
    elif r["finish"] == "stop":
        assert decoded == r["content"] + EOT, "token ids must decode to the text plus the end-of-turn token"
    else:
        assert r["finish"] == "length" and decoded == r["content"]
    want = ref_logprobs(ref, r["prompt_ids"], ids, temperature)
    assert max(abs(a - b) for a, b in zip(r["logprobs"], want)) < 1e-4


@pytest.mark.parametrize("stream", [False, True])
def test_ids_and_processed_logprobs_match_a_separate_forward_pass(client, ref, stream):
    msgs = [{"role": "user", "content": "Say hi"}]
    r = chat(client, msgs, stream=stream, max_tokens=40, temperature=0.7, seed=5)
    assert r["finish"] == "stop"  # this seed ends the turn, so the end-of-turn token is checked
    assert r["ids"][-1] == ref[1].eos_token_id
    check_invariants(r, ref, ref[1], 0.7)
    assert r["prompt_ids"] == ref[1].apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                         return_dict=False)


def test_same_seed_same_output_streaming_or_not(client, ref):
    msgs = [{"role": "user", "content": "Name three animals."}]
    a = chat(client, msgs, max_tokens=12, temperature=1.0, seed=5)
    b = chat(client, msgs, stream=True, max_tokens=12, temperature=1.0, seed=5)
    assert b["n_chunks"] == len(b["ids"]) + 1  # the role chunk, then one chunk per token
    assert a["ids"] == b["ids"] and a["content"] == b["content"] and a["finish"] == b["finish"] == "length"
    assert a["logprobs"] == pytest.approx(b["logprobs"], abs=1e-5)
    check_invariants(b, ref, ref[1], 1.0)
    c = chat(client, msgs, max_tokens=12, temperature=1.0, seed=6)
    assert c["ids"] != a["ids"]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_parsed_and_raw_markup_kept_in_ids(client, ref, stream):
    r = chat(client, [{"role": "user", "content": TOOL_PROMPT}], stream=stream, tools=TOOLS,
             max_tokens=40, temperature=0.0)
    assert r["tool_calls"], r
    call = r["tool_calls"][0]
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "ls"}
    assert call.id and call.type == "function"
    check_invariants(r, ref, ref[1], 0.0)
    assert "<tools>" in ref[1].decode(r["prompt_ids"])  # the hermes block reached the prompt


@pytest.mark.parametrize("stream", [False, True])
def test_tools_and_tool_history_without_a_call(client, ref, stream):
    msgs = [{"role": "user", "content": "List files."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt b.txt"},
            {"role": "user", "content": "Thanks. Now say hi."}]
    r = chat(client, msgs, stream=stream, tools=TOOLS, max_tokens=10, temperature=1.0, seed=2)
    check_invariants(r, ref, ref[1], 1.0)
    prompt = ref[1].decode(r["prompt_ids"])
    assert '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>' in prompt
    assert "<tool_response>\na.txt b.txt\n</tool_response>" in prompt and "<tools>" in prompt


def test_n_stop_strings_top_logprobs(client):
    r = client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "Count from 1 to 20, separated by commas."}],
        n=2, max_tokens=30, temperature=0.0, stop=["3\n", "\n"], logprobs=True, top_logprobs=3,
        extra_body={"return_token_ids": True})
    assert len(r.choices) == 2
    for c in r.choices:
        assert c.finish_reason == "stop" and c.model_extra["stop_reason"] == "\n"
        assert c.message.content == "1. 1"  # the text ends before the stop string
        assert len(c.logprobs.content) == len(c.model_extra["token_ids"])
        top = c.logprobs.content[0].top_logprobs
        assert len(top) == 3 and top[0].logprob >= top[1].logprob >= top[2].logprob
        assert top[0].logprob == pytest.approx(c.logprobs.content[0].logprob)  # greedy picks the top one
    assert r.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in r.choices)


def test_concurrent_requests_are_batched_and_match_sequential_runs(client, ref, engine_url):
    import urllib.request

    prompts = ["Hi", "Write one sentence about the sea.", "What is the capital of France? Answer briefly.",
               "Give me a word that rhymes with cat."]
    seq = [chat(client, [{"role": "user", "content": p}], max_tokens=16, temperature=0.9, seed=i)
           for i, p in enumerate(prompts)]
    with urllib.request.urlopen(f"{engine_url}/stats") as f:
        before = json.load(f)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(chat, client, [{"role": "user", "content": p}], stream=bool(i % 2), max_tokens=16,
                            temperature=0.9, seed=i) for i, p in enumerate(prompts)]
        par = [f.result() for f in futs]
    with urllib.request.urlopen(f"{engine_url}/stats") as f:
        after = json.load(f)
    assert after["peak_batch"] >= 2, "concurrent requests were served one after another"
    # Fewer decode steps than tokens: sequences shared steps.
    assert after["decode_steps"] - before["decode_steps"] < sum(len(r["ids"]) for r in par)
    for s, p in zip(seq, par):
        assert s["ids"] == p["ids"]
        assert s["logprobs"] == pytest.approx(p["logprobs"], abs=1e-4)
        check_invariants(p, ref, ref[1], 0.9)
