"""A fleet of two replicas (vLLM-format stubs, testing/vllm_stub.py, serving runtime LoRAs as vLLM
does): eval loads its adapter on every replica the proxy routes to, and a replica that forgot
the policy (restarted) is named, routed around, and costs no call."""
from __future__ import annotations

import pytest
import requests

from collect.proxy.background import BackgroundProxy
from pipeline.eval import EvalError, Policy, serving
from testing.vllm_stub import StubServer
from wharf.config import load_config
from wharf.endpoint import Endpoint

from proxy_util import close_rollout, make_cfg, open_rollout, post, rows


@pytest.fixture
def fleet():
    with StubServer(loras=True) as a, StubServer(loras=True) as b:
        yield a, b


def _cfg(a, b, *extra):
    return load_config(None, [f"endpoint.url={a.url}", f"proxy.upstreams=[{b.url}]", "endpoint.model=stub-model", *extra])


def test_eval_loads_its_adapter_on_every_replica(fleet, tmp_path):
    a, b = fleet
    ep = Endpoint(a.url, model="stub-model")
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_model.safetensors").write_bytes(b"weights")  # names it: eval-<sha256>
    p = Policy(str(tmp_path / "adapter"), "x", tmp_path / "adapter", None)
    with serving(ep, _cfg(a, b), p) as (name, refused):
        assert refused == [] and all(name in s.stub.adapters for s in (a, b))  # was: only on endpoint.url
    assert a.stub.adapters == {} and b.stub.adapters == {}  # unloaded from both after
    with StubServer() as plain:  # no runtime LoRA loading: refuses, and is routed none of the policy's calls
        with serving(ep, _cfg(a, plain), p) as (name, refused):
            assert refused == [plain.url] and name in a.stub.adapters
        with pytest.raises(EvalError, match="no replica serves"):
            with serving(Endpoint(plain.url, model="stub-model"), _cfg(plain, plain), p):
                pass


def test_a_replica_that_forgot_the_policy_is_routed_around(fleet, tmp_path):
    a, b = fleet
    for s in (a, b):
        s.stub.adapters["policy-v1"] = "/adapters/v1"
    cfg = make_cfg(tmp_path, a.url, f"proxy.upstreams=[{b.url}]")
    with BackgroundProxy(cfg) as p:
        opened = [open_rollout(p, f"r{i}", policy="policy-v1") for i in range(8)]
        b.stub.restart()  # its runtime LoRAs are gone; /health still answers 200
        for info in opened:
            r = post(f"{info['base_url']}/chat/completions",
                     json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 200, r.text
        for info in opened:
            close_rollout(p, info["rollout_id"])
        health = requests.get(f"{p.url}/health").json()
    assert b.stub.stats["missing_model"] >= 1  # some rollouts were routed to b (sticky hashing)
    assert b.stub.stats["missing_model"] == 1  # named once, then routed around
    assert {u["url"]: u["refused"] for u in health["upstreams"]} == {a.url: [], b.url: ["policy-v1"]}
    assert a.stub.stats["model:policy-v1"] == 8
    assert sorted(r["status"] for r in rows(p)) == ["ok"] * 8
