"""The recording proxy's admin API (open, close, route keys), closing while calls are in flight,
and sticky routing with failover across upstreams."""
from __future__ import annotations

import openai
import pyarrow.parquet as pq
import requests

from wharf.collect.proxy.background import BackgroundProxy
from wharf.core.schema import SCHEMA_VERSION
from testing.vllm_stub import StubServer

from proxy_util import ADMIN, close_rollout, make_cfg, open_rollout, post, proxy, rows  # proxy: the fixture


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
    assert len(flushed) == 1 and pq.read_metadata(flushed[0]).metadata[b"schema_version"] == str(SCHEMA_VERSION).encode()
    assert post(f"{proxy.admin_url}/admin/flush", headers=ADMIN).json() == {"shards": []}
    assert close_rollout(proxy, "adm") == {"rollout_id": "adm", "n_turns": 1, "n_errors": 0, "published": True}
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


def test_a_replica_that_refused_a_policy_gets_none_of_its_calls(tmp_path):
    with StubServer(model="a") as a, StubServer(model="b") as b:
        cfg = make_cfg(tmp_path, a.url, f"proxy.upstreams=[{b.url}]", f"proxy.refused={{policy-v1: [{b.url}]}}")
        with BackgroundProxy(cfg) as p:
            for i in range(8):
                for policy in ("policy-v1", "base"):
                    info = open_rollout(p, f"{policy}-{i}", policy=policy)
                    post(f"{info['base_url']}/chat/completions",
                         json={"model": "m", "messages": [{"role": "user", "content": "x"}]}).raise_for_status()
            models_at = {name: [body["model"] for body in up.stub.requests] for name, up in (("a", a), ("b", b))}
            assert sorted(models_at["a"] + models_at["b"]) == ["base"] * 8 + ["policy-v1"] * 8
            assert models_at["a"].count("policy-v1") == 8 and "policy-v1" not in models_at["b"]
            assert "base" in models_at["b"]  # the base model b does serve: routed as before
            assert [u["refused"] for u in p.proxy.pool.describe()] == [[], ["policy-v1"]]
