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
