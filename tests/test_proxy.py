"""The recording proxy against the vLLM-format stub: real HTTP, the real openai client, real parquet."""
from __future__ import annotations

import json
import os
import shutil
import socket

import openai
import pyarrow.parquet as pq
import pytest
import requests

from collect.testing.vllm_stub import StubServer
from collect.config import load_config
from collect.proxy.background import BackgroundProxy
from collect.proxy.wal import read_records
from collect.schema import read_dir

# Configured here (proxy.admin_token); left unset, each proxy draws its own (test_proxy_auth.py).
ADMIN_TOKEN = "test-admin-token"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
KEYS: dict[str, str] = {}  # rollout route -> its API key, filled by open_rollout


def post(url: str, **kw) -> requests.Response:
    """requests.post, with the rollout's key when `url` is under a route open_rollout opened."""
    key = next((k for base, k in KEYS.items() if url.startswith(base + "/")), None)
    if key is not None:
        kw["headers"] = {"Authorization": f"Bearer {key}", **(kw.get("headers") or {})}
    return requests.post(url, **kw)
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                           "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]


def make_cfg(tmp_path, upstream, *extra):
    return load_config(None, [f"endpoint.url={upstream}", "proxy.port=0", f"proxy.out_dir={tmp_path}/turns",
                              "proxy.health_interval_s=0", "proxy.shard_seconds=0", "sampling.temperature=0.7",
                              "sampling.top_p=0.9", "sampling.top_p_uncorrected=true", "endpoint.model=base-model", f"proxy.admin_token={ADMIN_TOKEN}",
                              *extra])


@pytest.fixture
def proxy(tmp_path, stub):
    with BackgroundProxy(make_cfg(tmp_path, stub.url)) as p:
        yield p


def admin_headers(p) -> dict:
    return {"Authorization": f"Bearer {p.admin_token}"}


def open_rollout(p, rid=None, **kw):
    r = post(f"{p.admin_url}/admin/rollouts", json={"rollout_id": rid, **kw} if rid else kw, headers=admin_headers(p))
    assert r.status_code == 201, r.text
    info = r.json()
    KEYS[info["base_url"][: -len("/v1")]] = info["api_key"]
    return info


def close_rollout(p, rid):
    r = post(f"{p.admin_url}/admin/rollouts/{rid}/close", headers=admin_headers(p))
    assert r.status_code == 200, r.text
    return r.json()


def rows(p, rid=None):
    t = read_dir(p.proxy.out_dir, "turns").to_pylist()
    return [r for r in t if rid is None or r["rollout_id"] == rid]


def wal_lines(p) -> int:
    return sum(len(read_records(f)[0]) for f in p.proxy.wal_dir.glob("seg-*.jsonl"))


def conversation(client, stream: bool, seed: int = 7):
    """Three calls: the model calls a tool, gets its output, then answers twice."""
    msgs = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "List the files."}]
    answers = []
    for i in range(3):
        kw = dict(model="agent-model", messages=msgs, seed=seed + i, max_tokens=12)
        if i == 0:
            kw["tools"] = TOOLS
        if stream:
            parts, tool_calls, finish = [], {}, None
            for ch in client.chat.completions.create(stream=True, **kw):
                assert ch.model == "agent-model"
                if not ch.choices:
                    continue
                d = ch.choices[0].delta
                parts.append(d.content or "")
                for tc in d.tool_calls or ():
                    slot = tool_calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                    slot["name"] += tc.function.name or ""
                    slot["arguments"] += tc.function.arguments or ""
                finish = ch.choices[0].finish_reason or finish
            answers.append(("".join(parts), tool_calls, finish))
        else:
            out = client.chat.completions.create(**kw)
            assert out.model == "agent-model"
            m = out.choices[0].message
            tcs = {i: {"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
                   for i, t in enumerate(m.tool_calls or [])}
            answers.append((m.content or "", tcs, out.choices[0].finish_reason))
        content, tcs, _ = answers[-1]
        if i == 0:
            assert tcs, "the stub answers a user turn with tools by a tool call"
            tc = tcs[0]
            msgs = msgs + [{"role": "assistant", "content": None, "tool_calls": [
                {"id": tc["id"], "type": "function", "function": {"name": tc["name"], "arguments": tc["arguments"]}}]},
                {"role": "tool", "tool_call_id": tc["id"], "content": "a.py b.py"}]
        else:
            msgs = msgs + [{"role": "assistant", "content": content}, {"role": "user", "content": "And then?"}]
    return answers


@pytest.mark.parametrize("stream", [False, True])
def test_three_call_conversation_rows_equal_upstream(proxy, stub, stream):
    info = open_rollout(proxy, "conv")
    client = openai.OpenAI(base_url=info["base_url"], api_key=info["api_key"], max_retries=0)
    answers = conversation(client, stream)
    assert close_rollout(proxy, "conv") == {"rollout_id": "conv", "n_turns": 3, "n_errors": 0}
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
        assert not set(knobs) & set(sent)  # the trainer could not reproduce their effect on the log-probs
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


def test_admin_api(proxy):
    a = open_rollout(proxy, "adm", policy="policy-v1")
    assert a["base_url"] == f"{proxy.url}/rollout/adm/v1" and a["api_key"].startswith("wr-")
    again = post(f"{proxy.admin_url}/admin/rollouts", json={"rollout_id": "adm"}, headers=ADMIN)
    assert again.status_code == 200 and again.json() == a
    generated = open_rollout(proxy)
    assert generated["rollout_id"] and generated["rollout_id"] != "adm"
    # The per-rollout key names the rollout on the plain route.
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=a["api_key"], max_retries=0)
    assert [m.id for m in client.models.list().data] == ["policy-v1"]
    client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
    st = requests.get(f"{proxy.admin_url}/admin/rollouts/adm", headers=ADMIN).json()
    assert st["state"] == "open" and st["n_turns"] == 1 and st["n_errors"] == 0
    assert requests.get(f"{proxy.admin_url}/admin/rollouts/zzz", headers=ADMIN).status_code == 404
    flushed = post(f"{proxy.admin_url}/admin/flush", headers=ADMIN).json()["shards"]
    assert len(flushed) == 1 and pq.read_metadata(flushed[0]).metadata[b"schema_version"] == b"1"
    assert post(f"{proxy.admin_url}/admin/flush", headers=ADMIN).json() == {"shards": []}
    assert close_rollout(proxy, "adm") == {"rollout_id": "adm", "n_turns": 1, "n_errors": 0}
    assert close_rollout(proxy, "adm")["n_turns"] == 1  # idempotent
    r = post(f"{proxy.admin_url}/admin/rollouts", json={"rollout_id": "adm"}, headers=ADMIN)
    assert r.status_code == 409
    assert requests.get(f"{proxy.url}/health").json()["status"] == "ok"
    m = requests.get(f"{proxy.url}/metrics").text
    assert 'wharf_proxy_calls_total{policy="policy-v1",status="ok"} 1' in m
    assert 'wharf_proxy_call_seconds_count{policy="policy-v1"} 1' in m
    assert 'wharf_proxy_completion_tokens_total{policy="policy-v1"}' in m


def test_close_waits_for_calls_in_flight(proxy):
    import threading
    info = open_rollout(proxy, "inflight")
    result = {}

    def call():
        result["r"] = post(f"{info['base_url']}/chat/completions",
                                    json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stub_delay": 0.5})

    t = threading.Thread(target=call)
    t.start()
    import time
    deadline = time.monotonic() + 10
    while requests.get(f"{proxy.admin_url}/admin/rollouts/inflight", headers=ADMIN).json()["inflight"] != 1:
        assert time.monotonic() < deadline, "the call never reached the proxy"
        time.sleep(0.01)
    assert close_rollout(proxy, "inflight")["n_turns"] == 1
    assert len(rows(proxy, "inflight")) == 1  # on disk when close returned
    t.join()
    assert result["r"].status_code == 200


def test_sticky_routing_and_failover(tmp_path):
    with StubServer(model="a") as a, StubServer(model="b") as b:
        cfg = make_cfg(tmp_path, a.url, f"proxy.upstreams=[{b.url}]")
        with BackgroundProxy(cfg) as p:
            ups = p.proxy.pool
            served = {}
            for i in range(12):
                rid = f"r{i}"
                info = open_rollout(p, rid)
                for _ in range(3):
                    post(f"{info['base_url']}/chat/completions",
                                  json={"model": "m", "messages": [{"role": "user", "content": "x"}]}).raise_for_status()
                served[rid] = ups.order(rid)[0].url
            assert set(served.values()) == {a.url, b.url}, "rollouts spread over both upstreams"
            assert a.stub.stats["requests"] + b.stub.stats["requests"] == 36
            assert a.stub.stats["requests"] % 3 == 0 and b.stub.stats["requests"] % 3 == 0, "sticky per rollout"
            # b goes away: b's rollouts fail over to a without an error.
            b.stop()
            moved = [rid for rid, u in served.items() if u == b.url]
            for rid in moved:
                r = post(f"{p.url}/rollout/{rid}/v1/chat/completions",
                                  json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
                assert r.status_code == 200, r.text
            assert not ups.upstreams[1].healthy
            p.call(ups.check(p.proxy.session))
            assert [u["healthy"] for u in ups.describe()] == [True, False]
            assert "last_error" in ups.describe()[1]
            p.call(p.proxy.store.flush())
            assert all(r["status"] == "ok" for r in rows(p))


def test_wal_is_written_before_the_answer_and_folded_at_startup(tmp_path, stub):
    cfg = make_cfg(tmp_path, stub.url, "proxy.shard_rows=100000")
    p = BackgroundProxy(cfg).start()
    info = open_rollout(p, "w")
    for i in range(5):
        post(f"{info['base_url']}/chat/completions",
                      json={"model": "m", "messages": [{"role": "user", "content": str(i)}]}).raise_for_status()
        assert wal_lines(p) == i + 1  # durable by the time the answer arrived
    assert rows(p) == []  # not yet published
    # Simulate a crash: copy the WAL aside before the clean stop publishes it, then put it back.
    saved = tmp_path / "saved_wal"
    shutil.copytree(p.proxy.wal_dir, saved)
    p.stop()
    published = rows(p)
    assert len(published) == 5
    for f in saved.glob("seg-*.jsonl"):
        shutil.copy(f, p.proxy.wal_dir / f.name)
    # ... plus a row that never made it to a shard, and a torn last line from a killed writer.
    seg = p.proxy.wal_dir / sorted(saved.glob("seg-*.jsonl"))[0].name
    extra = dict(json.loads(seg.read_bytes().splitlines()[0]), request_id="only-in-wal", turn=5)
    with open(seg, "ab") as f:
        f.write(json.dumps(extra).encode() + b"\n" + b'{"rollout_id": "w", "tu')
    with BackgroundProxy(cfg) as p2:
        assert p2.proxy.recovery["recovered_rows"] == 1
        got = rows(p2, "w")
        assert sorted(r["request_id"] for r in got) == sorted([r["request_id"] for r in published] + ["only-in-wal"])
        assert list(p2.proxy.wal_dir.glob("seg-*.jsonl.bad")) == []
        # The rollout is still open after the restart, with its key, and turns continue after the last one.
        r = post(f"{p2.url}/v1/chat/completions", headers={"Authorization": f"Bearer {info['api_key']}"},
                          json={"model": "m", "messages": [{"role": "user", "content": "again"}]})
        assert r.status_code == 200 and r.headers["x-wharf-turn"] == "6"
        assert close_rollout(p2, "w") == {"rollout_id": "w", "n_turns": 7, "n_errors": 0}
    assert len(rows(p2, "w")) == 7


def test_unreadable_wal_record_is_kept_aside(tmp_path, stub):
    cfg = make_cfg(tmp_path, stub.url)
    wal = tmp_path / "turns" / "_wal"
    wal.mkdir(parents=True)
    (wal / "seg-00000001.jsonl").write_bytes(b"garbage\n")
    with BackgroundProxy(cfg) as p:
        assert p.proxy.recovery["bad_segments"] == [str(wal / "seg-00000001.jsonl")]
    assert (wal / "seg-00000001.jsonl.bad").read_bytes() == b"garbage\n"


def test_foreign_file_in_out_dir_is_named(tmp_path, stub):
    out = tmp_path / "turns"
    out.mkdir()
    (out / "part-0.parquet").write_bytes(b"not parquet")
    from collect.schema import SchemaError
    with pytest.raises(SchemaError, match="part-0.parquet"):
        BackgroundProxy(make_cfg(tmp_path, stub.url)).start()
    assert os.path.exists(out / "part-0.parquet")


def test_wal_write_failure_never_answers_unrecorded(proxy):
    info = open_rollout(proxy, "diskfull")
    url = f"{info['base_url']}/chat/completions"
    store = proxy.proxy.store
    good_fd = store.wal.fd
    store.wal.fd = os.open(os.devnull, os.O_RDONLY)  # every write now fails like a full/broken disk
    try:
        r = post(url, json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 503 and "could not record" in r.json()["error"]["message"]
        r = post(url, json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True})
        assert "could not record" in r.text and "data: [DONE]" not in r.text
        assert store.pending == []
    finally:
        os.close(store.wal.fd)
        store.wal.fd = good_fd
    assert "wharf_proxy_record_failures_total 2" in requests.get(f"{proxy.url}/metrics").text
    r = post(url, json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200
    assert close_rollout(proxy, "diskfull")["n_turns"] == 1


def test_fast_shard_table_equals_schema_conversion():
    import array

    from collect import schema
    from collect.proxy.shards import turns_table
    base = {"rollout_id": "r", "api": "chat", "policy": "p", "request": "{}", "response": None, "sampling": "{}",
            "finish_reason": "stop", "status": "ok", "error": None}
    rows = [dict(base, turn=0, request_id="a", started_at=1700000000.123456, ended_at=1700000001.5,
                 prompt_token_ids=[1, 2, 3], completion_token_ids=[4], completion_logprobs=[-0.5]),
            dict(base, turn=1, request_id="b", started_at=1700000002.0, ended_at=None,
                 prompt_token_ids=array.array("i", [1, 2, 3, 4, 2**31 - 1]), completion_token_ids=array.array("i"),
                 completion_logprobs=array.array("f"), status="error", error="boom")]
    assert turns_table(rows).equals(schema.to_table("turns", [
        {k: list(v) if isinstance(v, array.array) else v for k, v in r.items()} for r in rows]))


def test_second_proxy_on_the_same_dir_is_refused(proxy, stub):
    cfg = make_cfg(proxy.proxy.out_dir.parent, stub.url)
    with pytest.raises(RuntimeError, match="in use by another proxy"):
        BackgroundProxy(cfg).start()


def test_restart_after_an_interrupted_compaction_counts_each_row_once(tmp_path, stub):
    from collect import schema
    cfg = make_cfg(tmp_path, stub.url)
    with BackgroundProxy(cfg) as p:
        url = f"{open_rollout(p, 'twice')['base_url']}/chat/completions"
        for _ in range(2):
            assert post(url, json={"model": "m", "messages": [{"role": "user", "content": "x"}]}).ok
            p.call(p.proxy.store.flush())
        turns = p.proxy.out_dir
    # A compaction killed between writing its shard and deleting the two it replaces.
    parts = schema.shard_files(turns)
    assert len(parts) == 2
    schema.write_table(turns / "part-zz-compact.parquet", "turns", read_dir(turns, "turns"),
                       {"replaces": json.dumps([f.name for f in parts])})
    with BackgroundProxy(cfg) as p:
        state = requests.get(f"{p.admin_url}/admin/rollouts/twice", headers=ADMIN).json()
        assert (state["n_turns"], state["n_errors"]) == (2, 0)
        assert close_rollout(p, "twice")["n_turns"] == 2


def test_run_files_holding_keys_or_calls_are_the_owners_only(proxy):
    opened = open_rollout(proxy)
    client = openai.OpenAI(base_url=opened["base_url"], api_key=opened["api_key"])
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    files = [proxy.proxy.wal_dir / "rollouts.jsonl", *proxy.proxy.wal_dir.glob("seg-*.jsonl")]
    assert len(files) >= 2
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o600, f
