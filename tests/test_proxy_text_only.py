"""proxy.text_only: a teacher that returns no token ids (the stub as an OpenAI-only server, which
refuses vLLM's parameters) is recorded as text: the request and the answer, the rows marked
text_only, no ids; without the key the same teacher's calls fail with a message naming it."""
from __future__ import annotations

import json

import openai
import pytest

from wharf.collect.proxy.background import BackgroundProxy
from testing.vllm_stub import StubServer

from proxy_util import close_rollout, conversation, make_cfg, open_rollout, rows


@pytest.fixture(scope="module")
def teacher():
    with StubServer(teacher=True) as s:
        yield s


@pytest.mark.parametrize("stream", [False, True])
def test_a_teachers_calls_are_recorded_as_text(tmp_path, teacher, stream):
    with BackgroundProxy(make_cfg(tmp_path, teacher.url, "proxy.text_only=true")) as p:
        info = open_rollout(p, "t")
        answers = conversation(openai.OpenAI(base_url=info["base_url"], api_key=info["api_key"], max_retries=0), stream)
        assert close_rollout(p, "t") == {"rollout_id": "t", "n_turns": 3, "n_errors": 0, "published": True}
        got = sorted(rows(p, "t"), key=lambda r: r["turn"])
    assert [r["status"] for r in got] == ["ok"] * 3 and all(r["text_only"] for r in got)
    assert all(r["prompt_token_ids"] == r["completion_token_ids"] == r["completion_logprobs"] == [] for r in got)
    for r, (content, tcs, finish) in zip(got, answers):
        sent = json.loads(r["sampling"])
        assert not {"return_token_ids", "logprobs", "top_k"} & set(sent)  # nothing an API model refuses
        assert sent["temperature"] == 0.7  # the run's sampling is still forced
        msg = json.loads(r["response"])["choices"][0]["message"]
        assert (msg.get("content") or "") == content and r["finish_reason"] == finish
        if tcs:
            assert msg["tool_calls"][0]["function"]["arguments"] == tcs[0]["arguments"]
    assert json.loads(got[2]["request"])["messages"][-1] == {"role": "user", "content": "And then?"}


def test_without_the_key_a_teacher_is_an_error_that_names_it(tmp_path, teacher):
    with BackgroundProxy(make_cfg(tmp_path, teacher.url)) as p:
        info = open_rollout(p, "v")
        client = openai.OpenAI(base_url=info["base_url"], api_key=info["api_key"], max_retries=0)
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert "Unrecognized request argument" in str(e.value)
        close_rollout(p, "v")
        (row,) = rows(p, "v")
    assert row["status"] == "error" and not row["text_only"]


def test_an_upstream_that_ignores_return_token_ids_is_told_to_use_the_key(tmp_path, stub):
    """llama.cpp and ollama ignore vLLM's parameters and answer without ids: the error says what to do."""
    with BackgroundProxy(make_cfg(tmp_path, stub.url)) as p:
        info = open_rollout(p, "w")
        client = openai.OpenAI(base_url=info["base_url"], api_key=info["api_key"], max_retries=0)
        with pytest.raises(openai.APIStatusError, match="proxy.text_only=true"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                           extra_body={"stub_fail": "no_token_ids"})
        close_rollout(p, "w")


def test_the_endpoint_launcher_takes_a_teacher_as_it_is(tmp_path, teacher):
    """No engine started, no token-id check (which a teacher fails) under proxy.text_only."""
    from wharf.engine.launch import launch
    from wharf.core.endpoint import EndpointError

    with launch(make_cfg(tmp_path, teacher.url, "proxy.text_only=true", "endpoint.launch=false")) as ep:
        assert ep.url == teacher.url and ep.process is None
    with pytest.raises(EndpointError):
        with launch(make_cfg(tmp_path, teacher.url, "endpoint.launch=false")):
            pass
