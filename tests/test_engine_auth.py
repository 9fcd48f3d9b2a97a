"""The engine's API key, as a run gets it by default: engine.launch starts the real local engine
with a random key (vLLM's --api-key behaviour), the run's own clients send it, nobody else gets in."""
from __future__ import annotations

import openai
import pytest
import requests

from wharf.engine import launch as launcher
from wharf.core import endpoint
from wharf.core.config import load_config
from wharf.collect.proxy.background import BackgroundProxy
from wharf.core.schema import read_dir
from testing.proxy_load import free_port

REPO = launcher.REPO_ROOT
CHAT = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.mark.slow
def test_a_launched_engine_takes_only_the_runs_key(tmp_path):
    port = free_port()
    cfg = load_config(REPO / "configs" / "default.yaml", [
        f"endpoint.url=http://127.0.0.1:{port}", "engine.threads=2", "proxy.port=0", "proxy.health_interval_s=0",
        f"proxy.out_dir={tmp_path}/turns"])
    assert cfg.endpoint.api_key is None and cfg.engine.api_key is None
    with launcher.launch(cfg, log_dir=tmp_path) as ep:  # its start-up check already sampled with the key
        url = ep.url
        assert ep.api_key and len(ep.api_key) >= 43
        assert (tmp_path / "endpoint-local.yaml").stat().st_mode & 0o777 == 0o600
        for key in (None, "wrong"):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            r = requests.post(f"{url}/v1/chat/completions", json=CHAT, headers=headers)
            assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}, r.text
            r = requests.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/tmp"},
                              headers=headers)
            assert r.status_code == 401, r.text
            assert requests.get(f"{url}/v1/models", headers=headers).status_code == 401
        assert requests.get(f"{url}/health").status_code == 200  # probes stay open, as in vLLM
        assert endpoint.Endpoint(url).healthy()
        with pytest.raises(endpoint.EndpointError, match="set endpoint.api_key"):
            endpoint.Endpoint(url).models()
        assert ep.models() == ["smollm2-135m"]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=ep.api_key, max_retries=0)
        assert client.chat.completions.create(**CHAT).usage.completion_tokens >= 1
        # The proxy forwards with the run's key (with_key), not with the agent's rollout key.
        with BackgroundProxy(endpoint.with_key(cfg, ep)) as p:
            o = requests.post(f"{p.admin_url}/admin/rollouts", json={},
                              headers={"Authorization": f"Bearer {p.admin_token}"}).json()
            agent = openai.OpenAI(base_url=o["base_url"], api_key=o["api_key"], max_retries=0)
            assert agent.chat.completions.create(**CHAT).choices[0].finish_reason in ("stop", "length")
    (row,) = read_dir(tmp_path / "turns", "turns").to_pylist()
    assert row["status"] == "ok" and row["completion_token_ids"]
    assert not endpoint.Endpoint(url).healthy(), "the launched engine was stopped"


def test_a_configured_key_must_agree_between_engine_and_endpoint():
    cfg = load_config(None, ["engine.api_key=a", "endpoint.api_key=b"])
    with pytest.raises(endpoint.EndpointError, match="differ"):
        launcher.launch_key(cfg)
    assert launcher.launch_key(load_config(None, ["engine.api_key=a"])) == "a"
    assert launcher.launch_key(load_config(None, ["endpoint.api_key=b"])) == "b"
    drawn = {launcher.launch_key(load_config(None)) for _ in range(2)}
    assert len(drawn) == 2, "a fresh key per launch when none is configured"
