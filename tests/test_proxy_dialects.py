"""Anthropic Messages and OpenAI Responses at the recording proxy, driven by the real SDKs.

The proxy translates both to chat completions upstream; a tap between the proxy and the upstream
keeps the raw chat answers, so the rows are compared with what the upstream really returned.
"""
from __future__ import annotations

import json
import os

import anthropic
import openai
import pytest
import requests

from testing.vllm_stub import StubServer
from wharf.core.config import load_config
from wharf.collect.proxy.dialects import anthropic as anth
from wharf.collect.proxy.dialects import responses as resp_dialect
from wharf.collect.proxy.background import BackgroundProxy
from wharf.core.schema import read_dir
from proxy_util import close_rollout, make_cfg, open_rollout, post, wal_lines
from test_proxy_engine import Tap, engine_view

A_TOOLS = [{"name": "bash", "description": "Run a shell command",
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}]
R_TOOLS = [{"type": "function", "name": "bash", "description": "Run a shell command",
            "parameters": A_TOOLS[0]["input_schema"]}]


@pytest.fixture(scope="module")
def tap():
    with StubServer() as s:
        yield Tap(s.url).start()


@pytest.fixture
def proxy(tmp_path, tap):
    tap.answers.clear()
    with BackgroundProxy(make_cfg(tmp_path, tap.url)) as p:
        yield p


def rows(p):
    return sorted(read_dir(p.proxy.out_dir, "turns").to_pylist(), key=lambda r: (r["rollout_id"], r["turn"]))


def check_rows_match_upstream(got: list[dict], answers: list, api: str | None, temperature: float = 0.7,
                              policy: str = "base-model") -> None:
    """Each row: the dialect, the chat body sent upstream, and the upstream's own ids and log-probs."""
    assert len(got) == len(answers)
    for row, (sent, raw) in zip(got, answers):
        up = engine_view(sent, raw)
        assert row["api"] == (api or row["api"]) and row["status"] == "ok" and row["policy"] == policy
        sampling = json.loads(row["sampling"])
        sampling.pop("wharf_notes", None)  # what the translation left out: kept in the row, never sent
        assert sampling == sent  # the whole translated chat body, as sent
        assert sent["return_token_ids"] and sent["logprobs"] and sent["temperature"] == temperature
        assert row["prompt_token_ids"] == up["prompt"]
        assert row["completion_token_ids"] == up["ids"] and up["ids"]
        assert row["completion_logprobs"] == pytest.approx(up["lps"], rel=1e-6)
        assert row["finish_reason"] == up["finish"]


def sdk_view(answer) -> dict:
    """What the SDK parsed, as JSON, less the `parsed` fields its stream helper adds itself."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k != "parsed"}
        return [strip(v) for v in x] if isinstance(x, list) else x
    return strip(answer.model_dump(mode="json", exclude_unset=True))


# -- Anthropic Messages ------------------------------------------------------------------------------
def anthropic_call(client, stream: bool, **kw):
    if not stream:
        return client.messages.create(**kw), None
    with client.messages.stream(**kw) as s:
        types = [e.type for e in s]
        return s.get_final_message(), types


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_tool_round_trip(proxy, tap, stream):
    info = open_rollout(proxy, "claude")
    client = anthropic.Anthropic(base_url=proxy.url + "/rollout/claude", api_key=info["api_key"], max_retries=0)
    system = [{"type": "text", "text": "You are a coding agent."}, {"type": "text", "text": "Be brief."}]
    msgs = [{"role": "user", "content": "List the files."}]
    first, types = anthropic_call(client, stream, model="claude-test", max_tokens=40, system=system,
                                  tools=A_TOOLS, messages=msgs)
    assert first.model == "claude-test" and first.stop_reason == "tool_use" and first.id.startswith("msg_")
    use = [b for b in first.content if b.type == "tool_use"][0]
    assert use.name == "bash" and use.input["command"].startswith("ls ")
    if stream:
        assert types[0] == "message_start" and types[-1] == "message_stop"
        assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(types)
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                           "content": [{"type": "text", "text": "a.py b.py"}]}]}]
    second, _ = anthropic_call(client, stream, model="claude-test", max_tokens=40, system=system,
                               tools=A_TOOLS, messages=msgs)
    assert second.stop_reason == "end_turn" and second.content[0].type == "text" and second.content[0].text
    assert close_rollout(proxy, "claude") == {"rollout_id": "claude", "n_turns": 2, "n_errors": 0, "published": True}

    got = rows(proxy)
    check_rows_match_upstream(got, tap.answers, "anthropic")
    for row, answer in zip(got, (first, second)):
        assert json.loads(row["response"]) == sdk_view(answer)
        assert answer.usage.input_tokens == len(row["prompt_token_ids"])
        assert answer.usage.output_tokens == len(row["completion_token_ids"])
    assert json.loads(got[1]["request"])["messages"] == msgs  # the agent's own body
    sent = json.loads(got[1]["sampling"])["messages"]
    assert sent[0] == {"role": "system", "content": "You are a coding agent.\n\nBe brief."}
    assert sent[2]["tool_calls"][0]["id"] == use.id and json.loads(sent[2]["tool_calls"][0]["function"]["arguments"]) == use.input
    assert sent[3:] == [{"role": "tool", "tool_call_id": use.id, "content": "a.py b.py"}]


def test_anthropic_plain_route_x_api_key_and_count_tokens(proxy, tap):
    info = open_rollout(proxy, "keyed")
    client = anthropic.Anthropic(base_url=proxy.url, api_key=info["api_key"], max_retries=0)
    out = client.messages.create(model="m", max_tokens=5, stop_sequences=["zzz"],
                                 messages=[{"role": "user", "content": "hi"}])
    assert out.stop_reason == "max_tokens" and out.usage.output_tokens == 5
    assert tap.answers[-1][0]["stop"] == ["zzz"] and tap.answers[-1][0]["max_tokens"] == 5
    n = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hello " * 40}], tools=A_TOOLS)
    assert n.input_tokens > 40  # the stub has no /tokenize: the estimate, from the translated prompt
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic.Anthropic(base_url=proxy.url, api_key="wrong", max_retries=0).messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "authentication_error"
    assert close_rollout(proxy, "keyed")["n_turns"] == 1  # count_tokens is not a turn


# -- OpenAI Responses --------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_responses_tool_round_trip(proxy, tap, stream):
    info = open_rollout(proxy, "codex")
    client = openai.OpenAI(base_url=info["base_url"], api_key=info["api_key"], max_retries=0)
    items = [{"role": "developer", "content": "Use the tools."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files."}]}]
    kw = dict(model="codex-test", instructions="You are codex.", tools=R_TOOLS, store=False, max_output_tokens=40)
    if stream:
        events = list(client.responses.create(input=items, stream=True, **kw))
        types = [e.type for e in events]
        assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
        assert "response.output_item.added" in types and "response.function_call_arguments.delta" in types
        assert [e.sequence_number for e in events] == list(range(len(events)))
        first = events[-1].response
    else:
        first = client.responses.create(input=items, **kw)
    assert first.object == "response" and first.status == "completed" and first.model == "codex-test"
    call = first.output[-1]
    assert call.type == "function_call" and call.name == "bash" and json.loads(call.arguments)["command"]
    items += [call.model_dump(exclude_none=True), {"type": "function_call_output", "call_id": call.call_id,
                                                   "output": "a.py b.py"}]
    if stream:  # the SDK's own accumulator checks the event order
        with client.responses.stream(input=items, **kw) as s:
            second = s.get_final_response()
    else:
        second = client.responses.create(input=items, **kw)
    msg = second.output[0]
    assert msg.type == "message" and msg.content[0].type == "output_text" and second.output_text
    assert second.usage.total_tokens == second.usage.input_tokens + second.usage.output_tokens
    assert close_rollout(proxy, "codex") == {"rollout_id": "codex", "n_turns": 2, "n_errors": 0, "published": True}

    got = rows(proxy)
    check_rows_match_upstream(got, tap.answers, "responses")
    for row, answer in zip(got, (first, second)):
        assert json.loads(row["response"]) == sdk_view(answer)
        assert answer.usage.input_tokens == len(row["prompt_token_ids"])
        assert answer.usage.output_tokens == len(row["completion_token_ids"])
    sent = json.loads(got[1]["sampling"])["messages"]
    assert sent[0] == {"role": "system", "content": "You are codex.\n\nUse the tools."}
    assert sent[2]["tool_calls"][0]["id"] == call.call_id
    assert sent[3] == {"role": "tool", "tool_call_id": call.call_id, "content": "a.py b.py"}
    assert json.loads(got[1]["request"])["input"] == items


def test_anthropic_history_translation():
    """Tool results go first (chat wants them right after the calls), text after; thinking is dropped."""
    chat = anth.to_chat({"max_tokens": 9, "system": "S", "stop_sequences": ["END"],
                         "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "tools": A_TOOLS,
                         "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "x"},
                                          {"type": "text", "text": "ok"},
                                          {"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "text", "text": "<reminder>"},
                                     {"type": "tool_result", "tool_use_id": "t1", "content": "a", "is_error": True}]}]})
    assert chat["messages"][2:] == [
        {"role": "assistant", "content": "ok", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "a"}, {"role": "user", "content": "<reminder>"}]
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False and chat["stop"] == ["END"]
    done = {"id": "chatcmpl-1", "model": "p", "usage": {"prompt_tokens": 4, "completion_tokens": 2},
            "choices": [{"message": {"content": "x"}, "finish_reason": "stop", "stop_reason": "END"}]}
    out = anth.from_chat(done, {"stop_sequences": ["END"]})
    assert (out["stop_reason"], out["stop_sequence"]) == ("stop_sequence", "END")


# -- errors --------------------------------------------------------------------------------------------
def test_bad_input_is_refused_in_the_agents_dialect_and_not_recorded(proxy):
    info = open_rollout(proxy, "bad")
    a = anthropic.Anthropic(base_url=proxy.url + "/rollout/bad", api_key=info["api_key"], max_retries=0)
    o = openai.OpenAI(base_url=info["base_url"], api_key=info["api_key"], max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        a.messages.create(model="m", max_tokens=0, messages=[{"role": "user", "content": "x"}])
    r = post(f"{proxy.url}/rollout/bad/v1/messages", data=b"{not json")
    assert r.status_code == 400 and r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        o.responses.create(model="m", input="x", previous_response_id="resp_1")
    with pytest.raises(openai.BadRequestError, match="namespace needs a 'tools' list"):
        o.responses.create(model="m", input="x", tools=[{"type": "namespace", "name": "ns"}])
    r = post(f"{info['base_url']}/responses", json={"model": "m"})
    assert r.status_code == 400 and "'input' is required" in r.json()["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        anthropic.Anthropic(base_url=proxy.url + "/rollout/nope", api_key="x", max_retries=0).messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert close_rollout(proxy, "bad")["n_turns"] == 0
    assert wal_lines(proxy) == 0 and rows(proxy) == []
    metrics = requests.get(f"{proxy.url}/metrics").text
    assert 'wharf_proxy_rejected_total{reason="bad_request"} 4' in metrics
    assert 'wharf_proxy_rejected_total{reason="bad_json"} 1' in metrics


@pytest.mark.parametrize("kind", ["503", "drop"])
def test_upstream_failures_reach_the_agent_in_its_dialect_and_are_rows(tmp_path, kind):
    with StubServer(error_rate=1.0, error_kinds=(kind,)) as stub, \
            BackgroundProxy(make_cfg(tmp_path, stub.url, "proxy.upstream_timeout_s=10")) as p:
        key = open_rollout(p, "fail")["api_key"]
        a = anthropic.Anthropic(base_url=p.url + "/rollout/fail", api_key=key, max_retries=0)
        o = openai.OpenAI(base_url=p.url + "/rollout/fail/v1", api_key=key, max_retries=0)
        am = dict(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
        for stream in (False, True):
            with pytest.raises(anthropic.APIStatusError) as e:
                if stream:
                    list(a.messages.create(stream=True, **am))
                else:
                    a.messages.create(**am)
            if kind == "503" or not stream:
                assert e.value.status_code in (502, 503)
            assert e.value.body["type"] == "error" and e.value.body["error"]["message"]
        with pytest.raises(openai.APIStatusError) as e:
            o.responses.create(model="m", input="x")
        assert e.value.status_code in (502, 503) and e.value.body["message"].startswith("upstream")
        if kind == "503":
            with pytest.raises(openai.APIStatusError):
                list(o.responses.create(model="m", input="x", stream=True))
        else:  # broken off mid-stream: an error event, then response.failed
            types = [e.type for e in o.responses.create(model="m", input="x", stream=True)]
            assert types[0] == "response.created" and types[-2:] == ["error", "response.failed"]
        assert close_rollout(p, "fail") == {"rollout_id": "fail", "n_turns": 4, "n_errors": 4, "published": True}
        got = rows(p)
        assert [r["api"] for r in got] == ["anthropic", "anthropic", "responses", "responses"]
        assert all(r["status"] == "error" and r["error"] and r["completion_token_ids"] == [] for r in got)
        assert json.loads(got[0]["response"])["type"] == "error"  # what the agent got
        assert "error" in json.loads(got[2]["response"])


def test_wal_failure_holds_back_the_finished_tool_call(proxy):
    """A streamed tool call whose row cannot be written must not reach the agent complete."""
    open_rollout(proxy, "disk")
    store = proxy.proxy.store
    good_fd = store.wal.fd
    store.wal.fd = os.open(os.devnull, os.O_RDONLY)
    try:
        body = {"model": "m", "max_tokens": 40, "tools": A_TOOLS, "stream": True,
                "messages": [{"role": "user", "content": "x"}]}
        r = post(f"{proxy.url}/rollout/disk/v1/messages", json=body)
        assert "could not record" in r.text and "event: error" in r.text
        assert "message_stop" not in r.text and "content_block_stop" not in r.text
        body = {"model": "m", "input": "x", "tools": R_TOOLS, "stream": True}
        r = post(f"{proxy.url}/rollout/disk/v1/responses", json=body)
        assert "could not record" in r.text and "response.failed" in r.text
        assert "response.output_item.done" not in r.text and "response.completed" not in r.text
    finally:
        os.close(store.wal.fd)
        store.wal.fd = good_fd
    assert "wharf_proxy_record_failures_total 2" in requests.get(f"{proxy.url}/metrics").text


def test_stream_translators_hold_from_the_first_finished_call():
    """Two streamed tool calls: the first one's stop/done event waits for tail(), with the rest."""
    def chunk(delta, finish=None, **top):
        return {"id": "chatcmpl-abc", "created": 1, "model": "p", **top,
                "choices": [{"index": 0, "delta": delta, "token_ids": [5], "finish_reason": finish}]}
    calls = [chunk({"role": "assistant", "content": "Let me look."}, prompt_token_ids=[1, 2, 3]),
             chunk({"tool_calls": [{"index": 0, "id": "c0", "function": {"name": "bash", "arguments": ""}}]}),
             chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"command": "ls"}'}}]}),
             chunk({"tool_calls": [{"index": 1, "id": "c1", "function": {"name": "bash", "arguments": "{}"}}]}),
             chunk({}, "tool_calls"), {"id": "chatcmpl-abc", "choices": [], "usage": {"prompt_tokens": 3,
                                                                                     "completion_tokens": 5}}]
    for mod, done in ((anth, b"event: content_block_stop"), (resp_dialect, b"event: response.output_item.done")):
        tr = mod.Stream({"model": "agent"})
        sent = b"".join(tr.feed(c) for c in calls)
        tail = tr.tail()
        final = tr.final()
        assert sent.count(done) == 1  # the text block/item only
        assert tail.count(done) == 2
        if mod is anth:
            assert [b["type"] for b in final["content"]] == ["text", "tool_use", "tool_use"]
            assert final["content"][1]["input"] == {"command": "ls"} and final["stop_reason"] == "tool_use"
            assert final["usage"]["input_tokens"] == 3 and final["usage"]["output_tokens"] == 5
        else:
            assert [i["type"] for i in final["output"]] == ["message", "function_call", "function_call"]
            assert final["output"][1]["arguments"] == '{"command": "ls"}' and final["status"] == "completed"
            assert final["usage"]["total_tokens"] == 8


# -- the real local engine -----------------------------------------------------------------------------
@pytest.mark.slow
def test_both_dialects_against_the_engine(engine_url, tmp_path):
    tap = Tap(engine_url).start()
    cfg = load_config(None, [f"endpoint.url={tap.url}", "proxy.port=0", f"proxy.out_dir={tmp_path}/turns",
                             "proxy.health_interval_s=0", "sampling.temperature=1.0", "sampling.top_p=1.0"])
    with BackgroundProxy(cfg) as p:
        key = open_rollout(p, "eng")["api_key"]
        a = anthropic.Anthropic(base_url=p.url + "/rollout/eng", api_key=key, max_retries=0)
        out = a.messages.create(model="claude-x", max_tokens=8, system="You are terse.",
                                messages=[{"role": "user", "content": "Say hello."}])
        with a.messages.stream(model="claude-x", max_tokens=8,
                               messages=[{"role": "user", "content": "Count to three."}]) as s:
            streamed = s.get_final_message()
        n = a.messages.count_tokens(model="claude-x", messages=[{"role": "user", "content": "Say hello."}])
        o = openai.OpenAI(base_url=p.url + "/rollout/eng/v1", api_key=key, max_retries=0)
        r1 = o.responses.create(model="codex-x", instructions="You are terse.", input="Say hello.",
                                max_output_tokens=8)
        with o.responses.stream(model="codex-x", input="Count to three.", max_output_tokens=2) as s:
            # 2 tokens: a length stop, which ends with response.incomplete as OpenAI's own API
            # does; the SDK's get_final_response() knows only response.completed.
            ends = [e.response for e in s if e.type in ("response.completed", "response.incomplete")]
        (r2,) = ends
        assert r2.status == "incomplete" and r2.incomplete_details.reason == "max_output_tokens"
        assert close_rollout(p, "eng")["n_turns"] == 4
    for m in (out, streamed):
        assert m.stop_reason in ("end_turn", "max_tokens") and m.usage.output_tokens > 0
    direct = post(f"{engine_url}/tokenize", json={"messages": [{"role": "user", "content": "Say hello."}]})
    assert n.input_tokens == direct.json()["count"]  # the engine's own count, not the estimate
    for r in (r1, r2):
        assert r.status in ("completed", "incomplete") and r.usage.output_tokens > 0
    got = sorted(read_dir(tmp_path / "turns", "turns").to_pylist(), key=lambda r: r["turn"])
    assert [r["api"] for r in got] == ["anthropic", "anthropic", "responses", "responses"]
    check_rows_match_upstream(got, tap.answers, None, temperature=1.0, policy=cfg.endpoint.model)
    for row, answer in zip(got, (out, streamed, r1, r2)):
        assert json.loads(row["response"]) == sdk_view(answer)


# -- what the real CLIs send (claude-code 2.1, codex 0.169) -----------------------------------------
@pytest.fixture
def small_ctx(tmp_path):
    """A proxy before a stub with an 8192-token context (it reports max_model_len on /tokenize)."""
    with StubServer(max_model_len=8192) as stub:
        tap = Tap(stub.url).start()
        with BackgroundProxy(make_cfg(tmp_path, tap.url)) as p:
            yield p, tap


def test_claude_code_extras_are_accepted_and_max_tokens_fits_the_context(small_ctx):
    p, tap = small_ctx
    key = open_rollout(p, "cc")["api_key"]
    body = {"model": "policy-v3", "max_tokens": 64000, "stream": True, "tools": A_TOOLS + [
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}],
            "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]},
                         {"role": "system", "content": "<reminder>be brief</reminder>"}],
            "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "metadata": {"user_id": "u"}}
    headers = {"anthropic-beta": "mid-conversation-system-2026-04-07,context-management-2025-06-27",
               "anthropic-version": "2023-06-01", "x-api-key": key}
    r = post(f"{p.url}/rollout/cc/v1/messages?beta=true", json=body, headers=headers)
    assert r.status_code == 200 and "event: message_stop" in r.text
    sent = tap.answers[-1][0]
    n_prompt = json.loads(tap.answers[-1][1].split(b"data: ", 2)[1].split(b"\n")[0])["prompt_token_ids"]
    assert sent["max_tokens"] == 8192 - len(n_prompt)  # 64000 asked: capped to what the context leaves
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "system"]  # the mid-conversation one in place
    assert [t["function"]["name"] for t in sent["tools"]] == ["bash"]
    assert close_rollout(p, "cc")["n_errors"] == 0
    (row,) = rows(p)
    assert json.loads(row["sampling"])["wharf_notes"] == {"dropped_tools": ["web_search_20250305"]}
    assert row["status"] == "ok"


def test_context_overflow_is_worded_as_the_real_apis_word_it(small_ctx):
    p, _ = small_ctx
    open_rollout(p, "long")
    long = "word " * 9000
    r = post(f"{p.url}/rollout/long/v1/messages", json={
        "model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": long}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["message"].startswith("prompt is too long: ") and "> 8192 maximum" in r.json()["error"]["message"]
    r = post(f"{p.url}/rollout/long/v1/responses", json={"model": "m", "input": long})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = post(f"{p.url}/rollout/long/v1/responses", json={"model": "m", "input": long, "stream": True})
    assert '"code":"context_length_exceeded"' in r.text.replace(" ", "")


def test_codex_namespace_and_custom_tools_round_trip():
    tools = [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}},
             {"type": "namespace", "name": "multi_agent_v1", "description": "sub-agents", "tools": [
                 {"type": "function", "name": "spawn_agent", "parameters": {"type": "object", "properties": {}}},
                 {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}}]},
             {"type": "custom", "name": "apply_patch", "description": "patch", "format": {"type": "grammar"}},
             {"type": "web_search", "external_web_access": True}]
    req = {"model": "m", "tools": tools, "input": [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "spawn_agent", "namespace": "multi_agent_v1", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
        {"type": "web_search_call", "id": "ws1", "status": "completed"}]}
    chat = resp_dialect.to_chat(req)
    assert [t["function"]["name"] for t in chat["tools"]] == ["exec_command", "spawn_agent",
                                                               "multi_agent_v1.exec_command", "apply_patch"]
    assert chat["wharf_notes"] == {"dropped_tools": ["web_search"]}
    calls = [m["tool_calls"][0]["function"] for m in chat["messages"] if m.get("tool_calls")]
    assert calls == [{"name": "spawn_agent", "arguments": "{}"},
                     {"name": "apply_patch", "arguments": '{"input": "*** Begin Patch"}'}]
    answer = {"id": "chatcmpl-x", "usage": {"prompt_tokens": 3, "completion_tokens": 2}, "choices": [{
        "finish_reason": "tool_calls", "message": {"content": None, "tool_calls": [
            {"id": "t1", "function": {"name": "multi_agent_v1.exec_command", "arguments": "{}"}},
            {"id": "t2", "function": {"name": "apply_patch", "arguments": '{"input": "diff"}'}}]}}]}
    out = resp_dialect.from_chat(answer, req)["output"]
    assert out[0]["type"] == "function_call" and (out[0]["name"], out[0]["namespace"]) == ("exec_command", "multi_agent_v1")
    assert out[1]["type"] == "custom_tool_call" and (out[1]["name"], out[1]["input"]) == ("apply_patch", "diff")
