"""Publishing reaches every replica the proxy routes to: two real local engines both serve
policy-v1 afterwards; a replica that refuses the adapter (a server answering vLLM's 500 on
/v1/load_lora_adapter) is recorded, named, and routed none of the policy's calls."""
from __future__ import annotations

import json
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from wharf.collect.proxy.upstreams import UpstreamPool
from wharf.collect.runner import with_refusals
from conftest import free_port
from wharf.train.publish import PublishError, publish
from wharf.core import model_store, procs
from wharf.core.config import load_config
from wharf.core.endpoint import Endpoint
from wharf.core.replicas import PublishRecord, not_serving

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


class Refusing(BaseHTTPRequestHandler):
    """A replica that is up and serves the base model but will not load an adapter."""

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "smollm2-135m", "object": "model"}]})
        else:
            self._send(200 if self.path == "/health" else 404, {})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(500, {"error": {"message": "out of LoRA slots", "type": "InternalServerError", "code": 500}})

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def refusing():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def second_engine():
    """A second real engine (the session's engine_url is the first): two replicas of one model."""
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="wharf-engine-")) / "engine.log"
    proc = procs.spawn([sys.executable, "-m", "wharf.engine", "--config", str(REPO / "configs/default.yaml"),
                        f"engine.port={port}", "engine.host=127.0.0.1", "engine.threads=1"], log, cwd=REPO)
    try:
        Endpoint(f"http://127.0.0.1:{port}").wait_healthy(300, proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        procs.stop(proc)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base, _ = model_store.load_model(model_store.embedded_model_dir(), "cpu", "float32")
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    path = tmp_path_factory.mktemp("adapters") / "adapter"
    model.save_pretrained(path)
    return path


def test_publish_loads_the_policy_on_every_replica_and_names_the_one_that_refuses(
        tmp_path, engine_url, second_engine, refusing, adapter):
    cfg = load_config(REPO / "configs/default.yaml", [
        f"runs_dir={tmp_path}", "name=t", f"endpoint.url={engine_url}",
        f"proxy.upstreams=[{second_engine},{refusing}]"])
    try:
        record = publish(cfg, adapter, "policy-v1")
        assert record.serving == [engine_url, second_engine]
        assert list(record.refused) == [refusing] and "out of LoRA slots" in record.refused[refusing]
        for url in (engine_url, second_engine):  # each replica serves it: listed, and it answers
            ep = Endpoint(url)
            assert "policy-v1" in ep.models()
            assert ep.request("POST", "/v1/completions", {"model": "policy-v1", "prompt": "Hi", "max_tokens": 2})[0] == 200
        assert PublishRecord.read(cfg.layout.published("policy-v1")) == record
        # what the loop's health check and per-round check ask: each engine's /v1/models root is this adapter
        assert list(not_serving([engine_url, second_engine, refusing], "policy-v1", adapter)) == [refusing]
        assert list(not_serving([engine_url], "policy-v1", adapter.parent / "another-run")) == [engine_url]
        # the next round, sampling policy-v1, routes none of its calls to the refusing replica
        round_cfg = with_refusals(load_config(REPO / "configs/default.yaml", [
            f"runs_dir={tmp_path}", "name=t", f"endpoint.url={engine_url}",
            f"proxy.upstreams=[{second_engine},{refusing}]", "collect.policy=policy-v1"]))
        assert round_cfg.proxy.refused == {"policy-v1": [refusing]}
        policy = {"r-new": "policy-v1", "r-base": "smollm2-135m"}
        pool = UpstreamPool([engine_url, second_engine, refusing], 0, round_cfg.proxy.refused, policy.get)
        for i in range(20):
            policy[f"r{i}"] = "policy-v1"
            assert refusing not in [u.url for u in pool.order(f"r{i}")]
        assert refusing in [u.url for u in pool.order("r-base")]  # the base model it does serve
    finally:
        for url in (engine_url, second_engine):  # the session's engine is shared with other tests
            if "policy-v1" in Endpoint(url).models():
                Endpoint(url).unload_adapter("policy-v1")


def test_publish_fails_when_every_replica_refuses(tmp_path, refusing, adapter):
    cfg = load_config(REPO / "configs/default.yaml", [f"runs_dir={tmp_path}", "name=t", f"endpoint.url={refusing}"])
    with pytest.raises(PublishError, match=f"failed on every replica .*{refusing}: .*out of LoRA slots"):
        publish(cfg, adapter, "policy-v1")
    assert PublishRecord.read(cfg.layout.published("policy-v1")).refused  # recorded all the same


def _adapter(path: Path, seed: int) -> Path:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base, _ = model_store.load_model(model_store.embedded_model_dir(), "cpu", "float32")
    get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                    init_lora_weights=False)).save_pretrained(path)
    return path


def _first_logprob(url: str, model: str) -> float:
    r = Endpoint(url)._json("POST", "/v1/completions", {"model": model, "prompt": "Name a colour.", "max_tokens": 1,
                                                        "temperature": 0, "logprobs": 1})
    return r["choices"][0]["logprobs"]["token_logprobs"][0]


def _unload(urls: list[str], names) -> None:
    for url in urls:  # the session's engine is shared with other tests
        for name in set(names) & set(Endpoint(url).models()):
            Endpoint(url).unload_adapter(name)


def test_two_runs_of_one_name_share_the_replicas_each_sampling_its_own(tmp_path, engine_url, second_engine):
    """expA/seed1 and expB/seed1 publish their policy-v1 on the same two replicas: each under its
    run's own name (was: both `policy-v1`, the second refused everywhere), each answering with its
    own weights; a later publish of expA unloads only expA's old policy, never expB's."""
    replicas = [engine_url, second_engine]
    cfgs = {run: load_config(REPO / "configs/default.yaml", [
        f"runs_dir={tmp_path / run}", "name=seed1", f"endpoint.url={engine_url}", f"proxy.upstreams=[{second_engine}]"])
        for run in ("expA", "expB")}
    adapters = {run: _adapter(cfg.layout.round(0).train.adapter, seed) for (run, cfg), seed in zip(cfgs.items(), (1, 2))}
    names = {run: cfg.policy(1) for run, cfg in cfgs.items()}
    a3 = cfgs["expA"].policy(3)
    try:
        for run, cfg in cfgs.items():
            assert publish(cfg, adapters[run], names[run]).serving == replicas
        assert len(set(names.values())) == 2 and all(n.startswith("seed1-") for n in names.values())
        for run in cfgs:
            assert not_serving(replicas, names[run], adapters[run]) == {}  # each name: its own run's adapter
        lp = {run: [_first_logprob(url, names[run]) for url in replicas] for run in cfgs}
        assert abs(lp["expA"][0] - lp["expB"][0]) > 1e-4 and abs(lp["expA"][0] - lp["expA"][1]) < 1e-4
        publish(cfgs["expA"], _adapter(cfgs["expA"].layout.round(2).train.adapter, 3), a3)  # keeps 1 before v3
        for url in replicas:
            assert {names["expB"], a3} <= set(Endpoint(url).models()) and names["expA"] not in Endpoint(url).models()
    finally:
        _unload(replicas, [*names.values(), a3])


def test_two_evals_of_the_same_weights_keep_each_others_adapter(tmp_path, engine_url, second_engine, adapter):
    """Two evals sample the same adapter on the same replicas; the first to finish unloads only
    what it loaded (was: one name per weights, the first loader unloaded it under the other)."""
    from contextlib import ExitStack

    from wharf.pipeline.eval import owner_of, resolve, serving

    replicas = [engine_url, second_engine]
    cfg = load_config(REPO / "configs/default.yaml", [f"endpoint.url={engine_url}", f"proxy.upstreams=[{second_engine}]"])
    p, ep = resolve(str(adapter)), Endpoint(engine_url, model="smollm2-135m")
    owners = [owner_of(load_config(None, [f"runs_dir={tmp_path}", f"name={run}"]).layout.eval("e").policy(p.label))
              for run in ("arm", "control")]
    names = [p.served_name("smollm2-135m", o) for o in owners]
    try:
        first, second = ExitStack(), ExitStack()
        name_a, _ = first.enter_context(serving(ep, cfg, p, owners[0]))
        name_b, _ = second.enter_context(serving(ep, cfg, p, owners[1]))
        first.close()  # the first eval is done; the second still samples
        for url in replicas:
            assert name_b in Endpoint(url).models() and name_a not in Endpoint(url).models()
            assert Endpoint(url).request("POST", "/v1/completions", {"model": name_b, "prompt": "Hi", "max_tokens": 1})[0] == 200
        second.close()
        assert all(name_b not in Endpoint(url).models() for url in replicas)
    finally:
        _unload(replicas, names)
