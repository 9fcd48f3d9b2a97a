"""Gemini's generateContent at the recording proxy, driven by the real google-genai SDK.

As in test_proxy_dialects.py, a tap between the proxy and the vLLM-shaped stub keeps the raw chat
answers, so the rows are compared with what the upstream really returned.
"""
from __future__ import annotations

import json

import pytest
from google import genai
from google.genai import errors, types

from wharf.collect.proxy.background import BackgroundProxy
from wharf.collect.proxy.dialects import gemini as gem
from proxy_util import close_rollout, make_cfg, open_rollout, post, wal_lines
from test_proxy_dialects import check_rows_match_upstream, proxy, rows, tap  # noqa: F401 (fixtures)
from testing.vllm_stub import StubServer

BASH = types.FunctionDeclaration(name="bash", description="Run a shell command", parameters_json_schema={
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]})
NO_AFC = types.AutomaticFunctionCallingConfig(disable=True)  # the test plays the agent's loop itself


def client(p, rid: str, key: str, **kw) -> genai.Client:
    opts = {"base_url": f"{p.url}/rollout/{rid}", "retry_options": {"attempts": 1}, **kw}
    return genai.Client(api_key=key, http_options=opts)


def ask(c: genai.Client, stream: bool, contents, config) -> types.GenerateContentResponse:
    """One call; a stream's chunks folded into one answer (text joined, calls and the last usage kept)."""
    if not stream:
        return c.models.generate_content(model="gemini-test", contents=contents, config=config)
    chunks = list(c.models.generate_content_stream(model="gemini-test", contents=contents, config=config))
    assert chunks[-1].candidates[0].finish_reason is not None and chunks[-1].usage_metadata
    assert all(ch.candidates[0].finish_reason is None for ch in chunks[:-1])
    parts = [p for ch in chunks for p in ch.candidates[0].content.parts or ()]
    text = "".join(p.text for p in parts if p.text)
    parts = ([types.Part(text=text)] if text else []) + [p for p in parts if p.function_call]
    last = chunks[-1]
    return types.GenerateContentResponse(
        candidates=[types.Candidate(content=types.Content(role="model", parts=parts),
                                    finish_reason=last.candidates[0].finish_reason)],
        usage_metadata=last.usage_metadata, model_version=last.model_version, response_id=last.response_id)


@pytest.mark.parametrize("stream", [False, True])
def test_gemini_tool_round_trip(proxy, tap, stream):
    info = open_rollout(proxy, "gem")
    c = client(proxy, "gem", info["api_key"])
    config = types.GenerateContentConfig(system_instruction="You are a coding agent.", max_output_tokens=40,
                                         tools=[types.Tool(function_declarations=[BASH])], automatic_function_calling=NO_AFC)
    contents = [types.Content(role="user", parts=[types.Part(text="List the files.")])]
    first = ask(c, stream, contents, config)
    (call,) = first.function_calls
    assert call.name == "bash" and call.args["command"].startswith("ls ") and call.id
    assert first.candidates[0].finish_reason == types.FinishReason.STOP and first.model_version == "gemini-test"
    contents += [first.candidates[0].content, types.Content(role="user", parts=[types.Part(
        function_response=types.FunctionResponse(id=call.id, name="bash", response={"output": "a.py b.py"}))])]
    second = ask(c, stream, contents, config)
    assert second.text and not second.function_calls
    assert close_rollout(proxy, "gem") == {"rollout_id": "gem", "n_turns": 2, "n_errors": 0, "published": True}

    got = rows(proxy)
    check_rows_match_upstream(got, tap.answers, "gemini")  # ids and log-probs: the upstream's own
    for row, answer in zip(got, (first, second)):
        assert answer.usage_metadata.prompt_token_count == len(row["prompt_token_ids"])
        assert answer.usage_metadata.candidates_token_count == len(row["completion_token_ids"])
        stored = json.loads(row["response"])  # what the agent got, assembled when streamed
        assert stored["candidates"][0]["content"]["parts"] == [
            p.model_dump(mode="json", by_alias=True, exclude_none=True) for p in answer.candidates[0].content.parts]
    sent = json.loads(got[1]["sampling"])["messages"]
    assert sent[0] == {"role": "system", "content": "You are a coding agent."}
    assert sent[2]["tool_calls"][0]["id"] == call.id and json.loads(sent[2]["tool_calls"][0]["function"]["arguments"]) == call.args
    assert sent[3] == {"role": "tool", "tool_call_id": call.id, "content": "a.py b.py"}
    assert json.loads(got[1]["request"])["contents"][2]["parts"][0]["functionResponse"]["id"] == call.id
    assert all(bool(sent_up.get("stream")) is stream for sent_up, _ in tap.answers)


def test_gemini_sampling_key_in_query_and_count_tokens(proxy, tap):
    info = open_rollout(proxy, "knobs")
    c = genai.Client(api_key=info["api_key"], http_options={"base_url": f"{proxy.url}/rollout/knobs"})
    out = c.models.generate_content(model="m", contents="hi", config=types.GenerateContentConfig(
        temperature=0.1, top_p=0.5, top_k=40, candidate_count=1, max_output_tokens=5, stop_sequences=["zzz"]))
    assert out.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS and out.usage_metadata.candidates_token_count == 5
    sent = tap.answers[-1][0]
    assert (sent["temperature"], sent["top_p"], sent["max_tokens"], sent["stop"]) == (0.7, 0.9, 5, ["zzz"])
    assert sent["top_k"] == -1  # the trainer cannot reproduce 40: noted in the row, sent neutral
    n = c.models.count_tokens(model="m", contents="hello " * 40)
    assert n.total_tokens > 40  # the stub has no /tokenize: the estimate, from the translated prompt
    r = post(f"{proxy.url}/v1beta/models/m:generateContent?key={info['api_key']}",
             json={"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 3}})
    assert r.status_code == 200 and r.json()["usageMetadata"]["candidatesTokenCount"] == 3
    assert close_rollout(proxy, "knobs")["n_turns"] == 2  # countTokens is not a turn
    assert json.loads(rows(proxy)[0]["sampling"])["wharf_notes"] == {"dropped_sampling": {"top_k": 40}}


def test_gemini_bad_input_is_a_gemini_error_and_not_recorded(proxy):
    info = open_rollout(proxy, "bad")
    c = client(proxy, "bad", info["api_key"])
    with pytest.raises(errors.ClientError) as e:
        c.models.generate_content(model="m", contents="x", config=types.GenerateContentConfig(candidate_count=2))
    assert e.value.code == 400 and e.value.status == "INVALID_ARGUMENT" and "candidateCount" in e.value.message
    base = f"{proxy.url}/rollout/bad/v1beta/models/m"
    for body, field in (({"contents": []}, "'contents'"),
                        ({"contents": [{"role": "tool", "parts": [{"text": "x"}]}]}, "contents[0].role"),
                        ({"contents": [{"parts": [{"fileData": {"fileUri": "gs://x"}}]}]}, "contents[0].parts[0]"),
                        ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"maxOutputTokens": 0}},
                         "generationConfig.maxOutputTokens")):
        r = post(f"{base}:generateContent", json=body, headers={"x-goog-api-key": info["api_key"]})
        assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT", r.text
        assert field in r.json()["error"]["message"]
    r = post(f"{base}:generateContent", data=b"{not json", headers={"x-goog-api-key": info["api_key"]})
    assert r.status_code == 400 and r.json()["error"]["code"] == 400
    r = post(f"{base}:streamGenerateContent", json={"contents": "x"}, headers={"x-goog-api-key": info["api_key"]})
    assert r.status_code == 400 and "alt=sse" in r.json()["error"]["message"]
    wrong = client(proxy, "bad", "wrong-key")  # held: a dropped Client closes its connection pool
    with pytest.raises(errors.ClientError) as e:
        wrong.models.generate_content(model="m", contents="x")
    assert e.value.code == 401 and e.value.status == "UNAUTHENTICATED"
    assert close_rollout(proxy, "bad")["n_turns"] == 0 and wal_lines(proxy) == 0


def test_gemini_upstream_failure_reaches_the_sdk_and_is_a_row(tmp_path):
    with StubServer(error_rate=1.0, error_kinds=("503",)) as stub, \
            BackgroundProxy(make_cfg(tmp_path, stub.url, "proxy.upstream_timeout_s=10")) as p:
        c = client(p, "fail", open_rollout(p, "fail")["api_key"])
        with pytest.raises(errors.ServerError) as e:
            c.models.generate_content(model="m", contents="x")
        assert e.value.code == 503 and e.value.status == "UNAVAILABLE"
        with pytest.raises(errors.APIError):
            list(c.models.generate_content_stream(model="m", contents="x"))
        assert close_rollout(p, "fail") == {"rollout_id": "fail", "n_turns": 2, "n_errors": 2, "published": True}
        got = rows(p)
        assert [r["api"] for r in got] == ["gemini", "gemini"] and all(r["status"] == "error" for r in got)
        assert json.loads(got[0]["response"])["error"]["status"] == "UNAVAILABLE"


def test_gemini_history_translation():
    """Snake-case fields (Google's parser takes both), Gemini Schema types, thoughts dropped, a
    functionResponse without an id paired with its call by name, tool results before the text."""
    chat = gem.to_chat({
        "system_instruction": {"parts": [{"text": "S1"}, {"text": "S2"}]},
        "tools": [{"function_declarations": [{"name": "bash", "parameters": {
            "type": "OBJECT", "property_ordering": ["cmd"],
            "properties": {"cmd": {"type": "STRING", "nullable": True}}}}]}, {"googleSearch": {}}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["bash"]}},
        "generationConfig": {"responseMimeType": "application/json", "seed": 3},
        "contents": [
            {"role": "user", "parts": [{"text": "go"}]},
            {"role": "model", "parts": [{"text": "hm", "thought": True}, {"text": "ok"},
                                        {"function_call": {"name": "bash", "args": {"cmd": "ls"}},
                                         "thoughtSignature": "sig"}]},
            {"role": "user", "parts": [{"text": "<reminder>"},
                                       {"functionResponse": {"name": "bash", "response": {"error": "no"}}}]}]})
    assert chat["messages"][0] == {"role": "system", "content": "S1\n\nS2"}
    assert chat["tools"] == [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"cmd": {"type": ["string", "null"]}}}}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "bash"}}
    assert chat["wharf_notes"] == {"dropped_tools": ["googleSearch"]}
    assert chat["response_format"] == {"type": "json_object"} and chat["seed"] == 3
    assert chat["messages"][2:] == [
        {"role": "assistant", "content": "ok", "tool_calls": [
            {"id": "call_1_2", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "call_1_2", "content": '{"error": "no"}'}, {"role": "user", "content": "<reminder>"}]


def test_gemini_stream_holds_from_the_first_finished_call():
    def chunk(delta, finish=None, **top):
        return {"id": "chatcmpl-abc", "created": 1, "model": "p", **top,
                "choices": [{"index": 0, "delta": delta, "token_ids": [5], "finish_reason": finish}]}
    tr = gem.Call("agent-model", True).Stream({})
    sent = b"".join(tr.feed(c) for c in [
        chunk({"role": "assistant", "content": "Let me look."}, prompt_token_ids=[1, 2, 3]),
        chunk({"tool_calls": [{"index": 0, "id": "c0", "function": {"name": "bash", "arguments": '{"comm'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'and": "ls"}'}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "c1", "function": {"name": "bash", "arguments": "{}"}}]}),
        chunk({}, "tool_calls"), {"id": "chatcmpl-abc", "choices": [], "usage": {"prompt_tokens": 3,
                                                                                "completion_tokens": 5}}])
    tail = tr.tail()
    assert b"functionCall" not in sent and sent.count(b"data: ") == 1  # the text only
    events = [json.loads(line[6:]) for line in tail.split(b"\n") if line.startswith(b"data: ")]
    assert [e["candidates"][0]["content"]["parts"] for e in events[:2]] == [
        [{"functionCall": {"id": "c0", "name": "bash", "args": {"command": "ls"}}}],
        [{"functionCall": {"id": "c1", "name": "bash", "args": {}}}]]
    assert events[-1]["candidates"][0]["finishReason"] == "STOP" and events[-1]["usageMetadata"] == {
        "promptTokenCount": 3, "candidatesTokenCount": 5, "totalTokenCount": 8}
    final = tr.final()
    assert final["modelVersion"] == "agent-model" and final["responseId"] == "abc"
    assert [list(p) for p in final["candidates"][0]["content"]["parts"]] == [["text"], ["functionCall"], ["functionCall"]]
    err = json.loads(tr.error(504, "upstream timed out")[6:])
    assert err == {"error": {"code": 504, "message": "upstream timed out", "status": "DEADLINE_EXCEEDED"}}
    over = gem.error_body(400, "This model's maximum context length is 8192 tokens. However, your request has "
                               "9000 input tokens.")
    assert over["error"]["message"] == "The input token count (9000) exceeds the maximum number of tokens allowed (8192)."
