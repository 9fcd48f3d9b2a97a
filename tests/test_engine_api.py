"""The engine's other routes and its error bodies (vLLM's shapes), over real HTTP."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest
from openai import OpenAI

from wharf.engine.chat_format import parse_tool_calls


def post(url: str, body: bytes | dict) -> tuple[int, dict | str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def assert_error(status, body, want_status, want_type, *words):
    assert status == want_status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == want_type and body["error"]["code"] == want_status
    for w in words:
        assert w in body["error"]["message"]


def served_ok(engine_url):
    status, body = post(f"{engine_url}/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert status == 200 and body["usage"]["completion_tokens"] >= 1


def test_bad_requests_get_openai_error_bodies_and_the_engine_keeps_serving(engine_url):
    chat = f"{engine_url}/v1/chat/completions"
    assert_error(*post(chat, b'{"messages": [oops'), 400, "BadRequestError", "not valid JSON")
    served_ok(engine_url)
    assert_error(*post(chat, {"model": "smollm2-135m"}), 400, "BadRequestError", "messages")
    assert_error(*post(chat, {"messages": "hi"}), 400, "BadRequestError", "messages")
    assert_error(*post(chat, {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}),
                 400, "BadRequestError", "temperature")
    status, body = post(chat, {"model": "nope", "messages": [{"role": "user", "content": "hi"}]})
    assert_error(status, body, 404, "NotFoundError", "The model `nope` does not exist.")
    assert body["error"]["param"] == "model"
    served_ok(engine_url)
    long = {"messages": [{"role": "user", "content": "word " * 2100}], "max_tokens": 4}
    assert_error(*post(chat, long), 400, "BadRequestError", "maximum context length is 2048 tokens",
                 "Please reduce the length of the input messages")
    assert_error(*post(chat, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000}),
                 400, "BadRequestError", "'max_tokens' or 'max_completion_tokens' is too large: 4000")
    served_ok(engine_url)


def test_openai_client_sees_typed_errors(engine_url):
    client = OpenAI(base_url=f"{engine_url}/v1", api_key="EMPTY", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(model="smollm2-135m", max_tokens=2,
                                       messages=[{"role": "user", "content": "word " * 2100}])
    r = client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=2)
    assert r.usage.completion_tokens >= 1


def test_completions_with_token_ids_tokenize_detokenize(engine_url):
    status, tok = post(f"{engine_url}/tokenize", {"prompt": "The capital of France is"})
    assert status == 200 and tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 2048
    status, de = post(f"{engine_url}/detokenize", {"tokens": tok["tokens"]})
    assert status == 200 and de["prompt"] == "The capital of France is"
    status, r = post(f"{engine_url}/v1/completions", {"model": "smollm2-135m", "prompt": tok["tokens"],
                                                      "max_tokens": 5, "temperature": 0, "logprobs": 2,
                                                      "return_token_ids": True})
    assert status == 200, r
    c = r["choices"][0]
    assert c["prompt_token_ids"] == tok["tokens"] and len(c["token_ids"]) == 5 == r["usage"]["completion_tokens"]
    assert c["finish_reason"] == "length"
    status, de = post(f"{engine_url}/detokenize", {"tokens": c["token_ids"]})
    assert de["prompt"] == c["text"]
    assert len(c["logprobs"]["token_logprobs"]) == 5 and all(len(t) == 2 for t in c["logprobs"]["top_logprobs"])
    # The same prompt as text gives the same greedy continuation.
    status, r2 = post(f"{engine_url}/v1/completions", {"prompt": "The capital of France is", "max_tokens": 5,
                                                       "temperature": 0, "return_token_ids": True})
    assert r2["choices"][0]["token_ids"] == c["token_ids"]
    assert_error(*post(f"{engine_url}/v1/completions", {"prompt": [1, 10 ** 9]}), 400, "BadRequestError",
                 "outside the vocabulary")


def test_tokenize_messages_matches_chat_prompt(engine_url):
    msgs = [{"role": "user", "content": "hello"}]
    status, tok = post(f"{engine_url}/tokenize", {"messages": msgs})
    status, r = post(f"{engine_url}/v1/chat/completions", {"messages": msgs, "max_tokens": 1,
                                                           "return_token_ids": True})
    assert r["prompt_token_ids"] == tok["tokens"]


def test_models_and_health(engine_url):
    with urllib.request.urlopen(f"{engine_url}/v1/models") as f:
        models = json.load(f)
    assert models["object"] == "list" and models["data"][0]["id"] == "smollm2-135m"
    assert models["data"][0]["max_model_len"] == 2048
    with urllib.request.urlopen(f"{engine_url}/health") as f:
        assert f.status == 200


def test_parse_tool_calls():
    content, calls = parse_tool_calls('I will look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}'
                                      '\n</tool_call>\n<tool_call>{"name": "read", "arguments": {}}</tool_call>')
    assert content == "I will look."
    assert [c["function"]["name"] for c in calls] == ["bash", "read"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"command": "ls"}
    assert parse_tool_calls("<tool_call>{not json}</tool_call>") == ("<tool_call>{not json}</tool_call>", [])
    assert parse_tool_calls("plain") == ("plain", [])
