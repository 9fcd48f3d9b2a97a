"""The recording proxy against the vLLM-format stub: real HTTP, the real openai client, real parquet.
What a call leaves: rows equal to the upstream's answers, the sampling forced upstream, and
failures and bad input as errors (helpers: proxy_util.py)."""
from __future__ import annotations

import json
import socket

import openai
import pytest
import requests

from wharf.collect.proxy.background import BackgroundProxy
from wharf.collect.proxy.forward import NEUTRAL_SAMPLING

from proxy_util import ADMIN, close_rollout, conversation, make_cfg, open_rollout, post, proxy, rows, wal_lines  # proxy: the fixture


@pytest.mark.parametrize("stream", [False, True])
def test_three_call_conversation_rows_equal_upstream(proxy, stub, stream):
    info = open_rollout(proxy, "conv")
    client = openai.OpenAI(base_url=info["base_url"], api_key=info["api_key"], max_retries=0)
    answers = conversation(client, stream)
    assert close_rollout(proxy, "conv") == {"rollout_id": "conv", "n_turns": 3, "n_errors": 0, "published": True}
    got = sorted(rows(proxy, "conv"), key=lambda r: r["turn"])
    assert [r["turn"] for r in got] == [0, 1, 2]
    assert all(r["status"] == "ok" and r["error"] is None and r["policy"] == "base-model" for r in got)
    assert got[0]["finish_reason"] == "tool_calls"
    for r, (content, tcs, finish) in zip(got, answers):
        # Replay exactly what was sent upstream straight to the stub: the row must hold its answer.
        sent = json.loads(r["sampling"])
        req = json.loads(r["request"])
        body = {**sent, "messages": req["messages"], "stream": False}
        if "tools" in req:
            body["tools"] = req["tools"]
        body.pop("stream_options", None)
        direct = post(f"{stub.url}/v1/chat/completions", json=body).json()
        assert r["prompt_token_ids"] == direct["prompt_token_ids"]
        assert r["completion_token_ids"] == direct["choices"][0]["token_ids"]
        lps = [e["logprob"] for e in direct["choices"][0]["logprobs"]["content"]]
        assert r["completion_logprobs"] == pytest.approx(lps, rel=1e-6)  # float32 column
        assert r["finish_reason"] == finish == direct["choices"][0]["finish_reason"]
        assert (content or None) == (direct["choices"][0]["message"]["content"] or None)
        resp = json.loads(r["response"])
        assert resp["model"] == "agent-model" and resp["choices"][0]["finish_reason"] == finish
        if tcs:
            assert resp["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == tcs[0]["arguments"]
    # The next prompt contains the tool result and the previous answer: ids grow turn by turn.
    assert len(got[2]["prompt_token_ids"]) > len(got[1]["prompt_token_ids"])


def test_streaming_and_full_runs_with_same_seed_give_same_rows(proxy):
    for rid, stream in (("full", False), ("stream", True)):
        info = open_rollout(proxy, rid)
        conversation(openai.OpenAI(base_url=info["base_url"], api_key=info["api_key"], max_retries=0), stream, seed=11)
        close_rollout(proxy, rid)
    cols = ("turn", "prompt_token_ids", "completion_token_ids", "completion_logprobs", "finish_reason", "status")
    a = [{c: r[c] for c in cols} for r in sorted(rows(proxy, "full"), key=lambda r: r["turn"])]
    b = [{c: r[c] for c in cols} for r in sorted(rows(proxy, "stream"), key=lambda r: r["turn"])]
    assert len(a) == 3 and a == b


def test_upstream_request_is_forced_and_recorded(tmp_path, stub):
    with BackgroundProxy(make_cfg(tmp_path, stub.url, "sampling.max_tokens=5")) as p:
        info = open_rollout(p, "forced", policy="policy-v3", temperature=0.5)
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 50,
                "include_reasoning": False, "temperature": 1.3, "top_p": 0.1, "top_logprobs": 3, "seed": 1,
                "top_k": 5, "min_p": 0.1, "logit_bias": {"50": 5}, "presence_penalty": 0.5, "min_tokens": 3}
        r = post(f"{info['base_url']}/chat/completions", json=body)
        assert r.status_code == 200, r.text
        sent = stub.stub.requests[-1]
        assert sent["model"] == "policy-v3"
        assert sent["temperature"] == 0.5 and sent["top_p"] == 0.9  # per-rollout override, then config
        assert sent["return_token_ids"] is True and sent["logprobs"] is True and sent["top_logprobs"] == 0
        assert sent["max_tokens"] == 5 and "max_completion_tokens" not in sent
        assert "include_reasoning" not in sent
        knobs = {"top_k": 5, "min_p": 0.1, "logit_bias": {"50": 5}, "presence_penalty": 0.5, "min_tokens": 3}
        assert not set(knobs) - set(NEUTRAL_SAMPLING) & set(sent)  # the trainer could not reproduce their effect
        # ... and those vLLM would fill from generation_config.json are sent neutral
        assert {k: sent[k] for k in NEUTRAL_SAMPLING} == {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
                                                          "presence_penalty": 0.0, "frequency_penalty": 0.0}
        bad = post(f"{p.admin_url}/admin/rollouts", json={"rollout_id": "greedy", "temperature": 0}, headers=ADMIN)
        assert bad.status_code == 400 and "must be > 0" in bad.json()["error"]["message"]
        close_rollout(p, "forced")
        (row,) = rows(p, "forced")
        assert json.loads(row["sampling"]) == {**{k: v for k, v in sent.items() if k != "messages"},
                                               "wharf_notes": {"dropped_sampling": knobs}}
        assert json.loads(row["request"]) == body  # as the agent sent it
        assert row["policy"] == "policy-v3" and len(row["completion_token_ids"]) == 5
        assert row["finish_reason"] == "length"


def test_rollout_seed_is_forced_per_turn(tmp_path, stub):
    with BackgroundProxy(make_cfg(tmp_path, stub.url)) as p:
        info = open_rollout(p, "seeded", seed=1000)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": 5}
        sent = []
        for _ in range(2):
            assert post(f"{info['base_url']}/chat/completions", json=body).status_code == 200
            sent.append(stub.stub.requests[-1]["seed"])
        assert sent == [1000, 1001]  # the agent's own seed is replaced: call k gets seed + k
        unseeded = open_rollout(p, "unseeded")
        assert post(f"{unseeded['base_url']}/chat/completions", json=body).status_code == 200
        assert stub.stub.requests[-1]["seed"] == 5  # no rollout seed: the agent's passes through
        bad = post(f"{p.admin_url}/admin/rollouts", json={"rollout_id": "x", "seed": "7"}, headers=ADMIN)
        assert bad.status_code == 400 and "seed" in bad.json()["error"]["message"]


def test_a_rollout_top_p_below_one_needs_the_configs_opt_in(tmp_path, stub):
    with BackgroundProxy(make_cfg(tmp_path, stub.url, "sampling.top_p=1.0", "sampling.top_p_uncorrected=false")) as p:
        bad = post(f"{p.admin_url}/admin/rollouts", json={"rollout_id": "t", "top_p": 0.5}, headers=ADMIN)
        assert bad.status_code == 400 and "top_p_uncorrected" in bad.json()["error"]["message"]
        open_rollout(p, "full", top_p=1.0)


def test_agent_gets_a_plain_openai_answer(proxy):
    info = open_rollout(proxy, "plain")
    url = f"{info['base_url']}/chat/completions"
    msg = [{"role": "user", "content": "hello"}]
    full = post(url, json={"model": "mine", "messages": msg}).json()
    assert "prompt_token_ids" not in full and "kv_transfer_params" not in full and "prompt_logprobs" not in full
    assert "token_ids" not in full["choices"][0] and full["choices"][0]["logprobs"] is None
    assert full["model"] == "mine"
    with_lp = post(url, json={"model": "mine", "messages": msg, "logprobs": True}).json()
    assert len(with_lp["choices"][0]["logprobs"]["content"]) == with_lp["usage"]["completion_tokens"]

    def events(body):
        r = post(url, json=body, stream=True)
        assert r.headers["Content-Type"].startswith("text/event-stream")
        out = [line[6:] for line in r.iter_lines() if line.startswith(b"data: ")]
        assert out[-1] == b"[DONE]"
        return [json.loads(e) for e in out[:-1]]

    chunks = events({"model": "mine", "messages": msg, "stream": True})
    assert all("prompt_token_ids" not in c and c["model"] == "mine" for c in chunks)
    assert all(c["choices"] for c in chunks), "usage chunk dropped when the agent did not ask for it"
    assert all("token_ids" not in ch and ch["logprobs"] is None for c in chunks for ch in c["choices"])
    chunks = events({"model": "mine", "messages": msg, "stream": True, "stream_options": {"include_usage": True}})
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


FAILURES = [("500", 500), ("503", 503), ("400", 400), ("invalid_json", 502), ("no_token_ids", 502), ("drop", 502)]


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_failures_are_errors_for_agent_and_rows(proxy, stream):
    info = open_rollout(proxy, f"fail-{stream}")
    url = f"{info['base_url']}/chat/completions"
    kinds = FAILURES + [("short_usage", 502)]
    for kind, status in kinds:
        body = {"model": "m", "messages": [{"role": "user", "content": kind}], "stream": stream, "stub_fail": kind}
        r = post(url, json=body)
        text = r.text
        if stream and r.status_code == 200:
            # Failure after the stream started: an error event, and never the [DONE] of a good answer.
            assert "\"error\"" in text and "data: [DONE]" not in text, (kind, text)
        else:
            assert r.status_code == status, (kind, r.status_code, text)
            assert "error" in r.json()
    # The openai client sees these as errors too.
    client = openai.OpenAI(base_url=info["base_url"], api_key=info["api_key"], max_retries=0)
    with pytest.raises(openai.APIError):
        list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=stream,
                                            extra_body={"stub_fail": "no_token_ids"}))
    res = close_rollout(proxy, f"fail-{stream}")
    assert res["n_turns"] == res["n_errors"] == len(kinds) + 1
    got = rows(proxy, f"fail-{stream}")
    assert len(got) == len(kinds) + 1
    for r in got:
        assert r["status"] == "error" and r["error"]
        assert r["prompt_token_ids"] == [] and r["completion_token_ids"] == [] and r["completion_logprobs"] == []
    errors = " ".join(r["error"] for r in got)
    assert "upstream answered 500" in errors and "not valid JSON" in errors and "token_ids" in errors


def test_timeout_and_refused_upstream(tmp_path, stub):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: refused
    with BackgroundProxy(make_cfg(tmp_path / "a", stub.url, "proxy.upstream_timeout_s=0.3")) as p:
        info = open_rollout(p, "slow")
        r = post(f"{info['base_url']}/chat/completions",
                          json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stub_delay": 1.0})
        assert r.status_code == 504 and "timed out" in r.json()["error"]["message"]
        close_rollout(p, "slow")
        (row,) = rows(p, "slow")
        assert row["status"] == "error" and "timed out" in row["error"]
    with BackgroundProxy(make_cfg(tmp_path / "b", dead)) as p:
        info = open_rollout(p, "dead")
        r = post(f"{info['base_url']}/chat/completions",
                          json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 502 and "no upstream reachable" in r.json()["error"]["message"]
        close_rollout(p, "dead")
        assert rows(p, "dead")[0]["status"] == "error"


def test_bad_input_is_refused_and_writes_nothing(tmp_path, stub):
    with BackgroundProxy(make_cfg(tmp_path, stub.url, "proxy.max_body_bytes=2000")) as p:
        info = open_rollout(p, "bad")
        url = f"{info['base_url']}/chat/completions"
        n_stub = stub.stub.stats["requests"]
        cases = [
            (post(url, data=b"{not json", headers={"Content-Type": "application/json"}), 400, "not valid JSON"),
            (post(url, json={"model": "m"}), 400, "messages"),
            (post(url, json={"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}), 400, "n > 1"),
            (post(url, json={"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}), 413,
             "max_body_bytes"),
            (post(f"{p.url}/rollout/nope/v1/chat/completions", json={"messages": []}), 404, "unknown rollout"),
            (post(f"{p.url}/v1/chat/completions", json={"messages": []},
                           headers={"Authorization": "Bearer wrong"}), 401, "unknown API key"),
            (post(f"{p.admin_url}/admin/rollouts", json={}), 401, "admin"),
            (post(f"{p.admin_url}/admin/rollouts", json={}, headers={"Authorization": "Bearer nope"}), 401, "admin"),
            (post(f"{p.admin_url}/admin/flush", headers={"Authorization": "Bearer nope"}), 401, "admin"),
            (post(f"{p.admin_url}/admin/rollouts", json={"rollout_id": "a/b"}, headers=ADMIN), 400, "rollout_id"),
            (post(f"{p.admin_url}/admin/rollouts", json={"polcy": "x"}, headers=ADMIN), 400, "unknown fields"),
            (post(f"{p.admin_url}/admin/rollouts", data=b"[1", headers=ADMIN), 400, "not valid JSON"),
            (post(f"{p.url}/admin/rollouts", json={}, headers=ADMIN), 404, "no admin API"),
        ]
        for resp, status, text in cases:
            assert resp.status_code == status, (status, resp.text)
            err = resp.json()["error"]
            assert text in err["message"] and err["type"], err
        assert stub.stub.stats["requests"] == n_stub, "nothing reached the endpoint"
        assert wal_lines(p) == 0, "nothing recorded"
        metrics = requests.get(f"{p.url}/metrics").text
        assert 'wharf_proxy_rejected_total{reason="bad_json"} 2' in metrics
        assert 'wharf_proxy_rejected_total{reason="too_large"} 1' in metrics
        assert 'wharf_proxy_rejected_total{reason="bad_admin_token"} 3' in metrics
        # Closed rollouts refuse calls on both routes.
        close_rollout(p, "bad")
        r = post(url, json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 403 and "closed" in r.json()["error"]["message"]
        r = post(f"{p.url}/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                          headers={"Authorization": f"Bearer {info['api_key']}"})
        assert r.status_code == 403
        assert rows(p, "bad") == []
