"""A fleet of two replicas (vLLM-format stubs, testing/vllm_stub.py, serving runtime LoRAs as vLLM
does): eval loads its adapter on every replica the proxy routes to, and a replica that forgot
the policy (restarted) is named, routed around, and costs no call."""
from __future__ import annotations

import pytest
import requests

from wharf.collect.proxy.background import BackgroundProxy
from wharf.pipeline.eval import EvalError, Policy, serving
from testing.vllm_stub import StubServer
from wharf.core.config import load_config
from wharf.core.endpoint import Endpoint

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


def test_a_round_reloads_its_policy_on_a_replica_that_restarted(fleet, tmp_path):
    """The loop's check before a round samples policy-v1 asks every replica, not endpoint.url only."""
    from wharf.pipeline.loop import ensure_served
    from wharf.core.layout import RunLayout
    from wharf.core.replicas import PublishRecord

    a, b = fleet
    cfg = _cfg(a, b, f"runs_dir={tmp_path}", "name=r")
    adapter = RunLayout.of(str(tmp_path), "r").round(0).train.adapter
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    v1 = cfg.policy(1)  # the run's own name for its policy-v1
    a.stub.adapters[v1] = str(adapter)  # b restarted: it lost policy-v1, a still serves it
    ensure_served(Endpoint(a.url, model="stub-model"), cfg, 1)
    assert b.stub.adapters == {v1: str(adapter.resolve())} and a.stub.adapters[v1] == str(adapter)
    record = PublishRecord.read(cfg.layout.published(v1))
    assert record is not None and record.serving == [a.url, b.url] and record.refused == {}


def _adapter(root, run: str, k: int):
    from wharf.core.layout import RunLayout

    path = RunLayout.of(str(root), run).round(k - 1).train.adapter
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text("{}")
    return path


def test_two_runs_on_one_fleet_never_serve_or_unload_each_others_policy(fleet, tmp_path):
    """An arm and its control share the replicas: each samples its policy-v1 under its own name;
    a name is still checked by its root (the adapter dir /v1/models gives), so run B neither
    samples nor unloads run A's adapter, even under a name both used before per-run names."""
    from wharf.pipeline.loop import ensure_served
    from wharf.train.publish import PublishError, publish
    from wharf.core.replicas import PublishRecord

    a, b = fleet
    run_a, run_b = (_cfg(a, b, f"runs_dir={tmp_path}", f"name={n}") for n in ("arm", "control"))
    mine = _adapter(tmp_path, "arm", 1)
    publish(run_a, mine, "policy-v1")
    theirs = _adapter(tmp_path, "control", 1)
    with pytest.raises(PublishError, match="another run"):
        publish(run_b, theirs, "policy-v1")
    ensure_served(Endpoint(a.url, model="stub-model"), run_b, 1)  # the loop: B's own name, served beside A's
    assert {s.stub.adapters[run_b.policy(1)] for s in (a, b)} == {str(theirs.resolve())}
    record = PublishRecord.read(run_b.layout.published("policy-v1"))
    assert sorted(record.refused) == sorted([a.url, b.url]) and record.serving == []
    assert {s.stub.adapters["policy-v1"] for s in (a, b)} == {str(mine.resolve())}  # A's, untouched
    # B's own old policy is unloaded when it publishes policy-v3 (keep 1); A's policy-v1 stays
    b.stub.adapters["policy-v1"] = str(theirs)
    publish(run_b, _adapter(tmp_path, "control", 3), "policy-v3")
    assert set(a.stub.adapters) == {"policy-v1", "policy-v3"} and set(b.stub.adapters) == {"policy-v3"}


def test_a_replica_root_matches_the_same_object_under_another_machines_mirror(tmp_path, monkeypatch):
    from wharf.core import storage
    from wharf.core.replicas import same_adapter, serves_ours

    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "b"))
    here = storage.local_path("s3://bkt/runs/r/rounds/0/train/adapter")
    assert same_adapter(str(here), here)
    assert same_adapter("/elsewhere/mirror/s3/bkt/runs/r/rounds/0/train/adapter", here)  # machine A's mirror
    assert not same_adapter("/elsewhere/mirror/s3/bkt/runs/other/rounds/0/train/adapter", here)
    assert not same_adapter(None, here) and not same_adapter("/x/adapter", tmp_path / "adapter")
    # vLLM's LoRA resolver loads <its dir>/<name>: a copy the user synced, taken as this run's
    assert serves_ours("/lora-cache/policy-v1", "policy-v1", here) and not serves_ours("/x/adapter", "policy-v1", here)


def test_a_round_trained_again_is_not_taken_as_served_with_its_old_weights(fleet, tmp_path):
    """Same name, same dir, other weights: the replicas still hold the first training's. The loop's
    resumed publish refuses them (naming both digests) until the name is unloaded there."""
    from wharf.train.publish import PublishError, publish

    a, b = fleet
    cfg = _cfg(a, b, f"runs_dir={tmp_path}", "name=r")
    adapter = _adapter(tmp_path, "r", 1)
    (adapter / "adapter_model.safetensors").write_bytes(b"first training")
    publish(cfg, adapter, "policy-v1", resume=True)
    publish(cfg, adapter, "policy-v1", resume=True)  # killed mid-publish and resumed: accepted
    (adapter / "adapter_model.safetensors").write_bytes(b"trained again")
    for _ in range(2):  # and again on a retry: the record keeps what each replica holds
        with pytest.raises(PublishError, match="loaded before .* was trained again"):
            publish(cfg, adapter, "policy-v1", resume=True)
    for s in (a, b):
        s.stub.adapters.pop("policy-v1")  # the user unloads it
    record = publish(cfg, adapter, "policy-v1", resume=True)
    assert record.serving == [a.url, b.url] and len({r.weights for r in record.replicas}) == 1
