"""Credentials of the proxy, as an agent or a stranger meets them over real HTTP: a random admin
token on a listener of its own, rollout routes that need their rollout's key, 128-bit ids, and
owner-only run files. The proxy runs on the vLLM-shaped stub (tests/test_proxy.py's setup)."""
from __future__ import annotations

import asyncio
import json
import re
from urllib.parse import urlsplit

import openai
import pytest
import requests

from wharf.core.config import ConfigError, dump_config, load_config
from wharf.core.configio import dump_whole
from wharf.core.credentials import AdminAccess
from wharf.core.layout import admin_file
from wharf.collect.proxy.background import BackgroundProxy
from wharf.collect.proxy_client import ProxyAdmin, ServiceError, proxy_process
from wharf.collect.tasksets import PlannedRollout, Task, new_rollout_id
from testing.proxy_load import free_port
from testing.vllm_stub import StubServer
from tests.test_proxy import rows, wal_lines

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def cfg_for(tmp_path, upstream, *extra):
    """No admin_token: the proxy draws its own, as in a real run."""
    return load_config(None, [f"endpoint.url={upstream}", "proxy.port=0", f"proxy.out_dir={tmp_path}/turns",
                              "proxy.health_interval_s=0", "proxy.shard_seconds=0", *extra])


@pytest.fixture
def proxy(tmp_path, stub):
    with BackgroundProxy(cfg_for(tmp_path, stub.url)) as p:
        yield p


def admin(p, method: str, path: str, token: str | None = "", **kw) -> requests.Response:
    """An admin call; token '' means the proxy's own, None sends no header."""
    headers = {} if token is None else {"Authorization": f"Bearer {token or p.admin_token}"}
    return requests.request(method, f"{p.admin_url}{path}", headers=headers, timeout=30, **kw)


def mode(path) -> int:
    return path.stat().st_mode & 0o777


def test_admin_token_is_random_per_proxy_and_checked(tmp_path, stub, proxy):
    with BackgroundProxy(cfg_for(tmp_path / "other", stub.url)) as other:
        assert other.admin_token != proxy.admin_token
    assert len(proxy.admin_token) >= 43  # 32 random bytes, URL-safe
    assert admin(proxy, "POST", "/admin/rollouts", token=None, json={}).status_code == 401
    wrong = admin(proxy, "POST", "/admin/rollouts", token=other.admin_token, json={})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    assert "admin_token" in wrong.json()["error"]["message"]
    assert admin(proxy, "POST", "/admin/flush", token="x").status_code == 401
    assert admin(proxy, "POST", "/admin/rollouts", json={}).status_code == 201
    # The URL and token are in a file only the owner can read, for the runner and for curl.
    f = admin_file(proxy.proxy.wal_dir)
    assert mode(f) == 0o600
    assert AdminAccess.load(f) == AdminAccess(proxy.admin_url, proxy.admin_token, AdminAccess.load(f).pid)


def test_the_agents_listener_has_no_admin_api(proxy):
    for method, path in (("POST", "/admin/rollouts"), ("POST", "/admin/flush"), ("GET", "/admin/rollouts/x"),
                         ("GET", "/admin")):
        r = requests.request(method, f"{proxy.url}{path}", headers={"Authorization": f"Bearer {proxy.admin_token}"},
                             json={})
        assert r.status_code == 404, (path, r.text)
        assert r.json()["error"]["type"] == "not_found_error"
    assert proxy.url != proxy.admin_url
    assert requests.get(f"{proxy.url}/health").json()["status"] == "ok"  # probes still answer there


def test_a_rollout_route_needs_that_rollouts_key(proxy, stub):
    a = admin(proxy, "POST", "/admin/rollouts", json={"rollout_id": "a"}).json()
    b = admin(proxy, "POST", "/admin/rollouts", json={"rollout_id": "b"}).json()
    url = f"{a['base_url']}/chat/completions"
    n_stub = stub.stub.stats["requests"]
    refused = [
        requests.post(url, json=CHAT),  # the id alone
        requests.post(url, json=CHAT, headers={"Authorization": f"Bearer {b['api_key']}"}),  # another rollout's key
        requests.post(url, json=CHAT, headers={"x-api-key": b["api_key"]}),
        requests.post(url, json=CHAT, headers={"Authorization": "Bearer "}),
        requests.get(f"{a['base_url']}/models"),
        requests.post(f"{proxy.url}/v1/chat/completions", json=CHAT),  # plain route, no key
    ]
    for r in refused:
        assert r.status_code == 401, r.text
        err = r.json()["error"]
        assert err["type"] == "authentication_error" and "key" in err["message"], err
    assert "needs its own API key" in refused[0].json()["error"]["message"]
    assert stub.stub.stats["requests"] == n_stub, "nothing reached the endpoint"
    assert wal_lines(proxy) == 0, "nothing was recorded"
    # Its own key, as the OpenAI SDK (Bearer) or an Anthropic client (x-api-key) sends it.
    client = openai.OpenAI(base_url=a["base_url"], api_key=a["api_key"], max_retries=0)
    assert client.chat.completions.create(**CHAT).choices[0].message is not None
    r = requests.post(f"{proxy.url}/rollout/a/v1/messages", headers={"x-api-key": a["api_key"]},
                      json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert admin(proxy, "POST", "/admin/rollouts/a/close").json()["n_turns"] == 2
    assert admin(proxy, "POST", "/admin/rollouts/b/close").json()["n_turns"] == 0
    assert [r["rollout_id"] for r in rows(proxy)] == ["a", "a"]


def test_ids_and_keys_carry_at_least_128_random_bits(proxy, tmp_path):
    opened = [admin(proxy, "POST", "/admin/rollouts", json={}).json() for _ in range(3)]
    for o in opened:
        assert re.fullmatch(r"[0-9a-f]{32}", o["rollout_id"]), o  # 128 bits, when the runner names none
        assert len(o["api_key"]) >= 24 + 3  # "wr-" + 18 random bytes, URL-safe
    assert len({o["rollout_id"] for o in opened}) == len({o["api_key"] for o in opened}) == 3
    planned = PlannedRollout(Task("fix-sum-to", tmp_path), attempt=0)
    ids = {new_rollout_id("0123456789abcdef", planned) for _ in range(3)}
    assert len(ids) == 3 and all(re.fullmatch(r"01234567\.fix-sum-to\.0\.[0-9a-f]{32}", i) for i in ids), ids


def test_run_files_holding_secrets_are_created_owner_only(proxy, tmp_path):
    admin(proxy, "POST", "/admin/rollouts", json={})
    assert mode(proxy.proxy.wal_dir / "rollouts.jsonl") == 0o600
    cfg = load_config(None, ["proxy.admin_token=s3cret", "endpoint.api_key=k3y"])
    out = tmp_path / "configs" / "cfg.yaml"
    dump_config(cfg, out)
    assert mode(out) == 0o600
    dump_config(cfg, out)  # replaced, still the owner's only
    assert mode(out) == 0o600 and "s3cret" not in out.read_text()  # a record: its secrets taken out
    assert [f.name for f in out.parent.iterdir()] == ["cfg.yaml"], "no temp file left behind"
    whole = tmp_path / "private" / "cfg.yaml"
    dump_whole(cfg, whole)  # what a child process reads: every secret, owner-only
    assert mode(whole) == 0o600 and "s3cret" in whole.read_text()


@pytest.mark.parametrize("key", ["proxy.admin_token", "engine.api_key", "endpoint.api_key"])
def test_an_empty_secret_is_refused_at_load_naming_the_key(key, tmp_path):
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}: .*empty"):
        load_config(None, [f"{key}="])
    f = tmp_path / "run.yaml"
    section, name = key.split(".")
    f.write_text(f"{section}:\n  {name}: ''\n")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(f))}: {re.escape(key)}: .*unset \(null\)"):
        load_config(f)
    assert getattr(getattr(load_config(None), section), name) is None  # no fixed default


def test_the_proxy_forwards_with_the_endpoints_key(tmp_path):
    with StubServer(api_key="engine-key") as keyed:
        direct = requests.post(f"{keyed.url}/v1/chat/completions", json=CHAT)
        assert direct.status_code == 401 and direct.json() == {"error": "Unauthorized"}  # vLLM's body
        assert requests.get(f"{keyed.url}/health").status_code == 200
        for key, ok in (("engine-key", True), (None, False)):
            extra = [f"endpoint.api_key={key}"] if key else []
            with BackgroundProxy(cfg_for(tmp_path / str(key), keyed.url, *extra)) as p:
                o = admin(p, "POST", "/admin/rollouts", json={}).json()
                r = requests.post(f"{o['base_url']}/chat/completions", json=CHAT,
                                  headers={"Authorization": f"Bearer {o['api_key']}"})
                assert (r.status_code == 200) == ok, r.text
        # The agent's rollout key never reaches the endpoint; the endpoint's key never reaches the agent.
        assert all(q.get("model") for q in keyed.stub.requests)


def test_the_runner_hands_the_proxy_child_its_token(tmp_path, stub):
    port = free_port()
    cfg = load_config(None, [f"endpoint.url={stub.url}", f"proxy.port={port}", "proxy.health_interval_s=0"])
    assert cfg.proxy.admin_token is None
    conf = tmp_path / "logs" / "proxy.yaml"

    async def drive(access: AdminAccess) -> tuple:
        async with ProxyAdmin(access.url, access.token) as adm:
            opened = await adm.open("r1", "stub-model")
            r = requests.post(f"{opened.base_url}/chat/completions", json=CHAT,
                              headers={"Authorization": f"Bearer {opened.api_key}"})
            return opened, r.status_code, await adm.close("r1")

    with proxy_process(cfg, conf, tmp_path / "turns", tmp_path / "logs" / "proxy.log") as access:
        assert access.url != f"http://127.0.0.1:{port}" and len(access.token) >= 43
        opened, status, closed = asyncio.run(drive(access))
        assert requests.post(f"http://127.0.0.1:{port}/admin/flush",
                             headers={"Authorization": f"Bearer {access.token}"}).status_code == 404
        # the child got the token (it answers to it) from a private file; the run dir's record has none
        assert mode(conf) == 0o600 and access.token not in conf.read_text()
    assert opened.base_url == f"http://127.0.0.1:{port}/rollout/r1/v1" and status == 200
    assert closed.n_turns == 1
    assert not admin_file(tmp_path / "turns" / "_wal").exists(), "a stopped proxy leaves no admin file"
    log = (tmp_path / "logs" / "proxy.log").read_text()
    assert access.token not in log and json.dumps(access.token) not in log, "the token is never logged"


@pytest.mark.parametrize("text", ["", "{not json", '{"url": "http://127.0.0.1:1"}', '{"url": "u", "token": "t", "pid": "x"}'])
def test_a_corrupt_admin_file_is_refused_naming_it(tmp_path, text):
    f = tmp_path / "admin.json"
    f.write_text(text)
    with pytest.raises(ValueError, match=rf"{re.escape(str(f))}: not a readable proxy admin file"):
        AdminAccess.load(f)
    assert f.read_text() == text  # nothing rewritten


def test_a_port_another_run_listens_on_is_refused_before_the_proxy_starts(tmp_path, stub, proxy):
    """Two runs with the same proxy.port: the second would see the first's /health and miss its
    own admin file; it is refused up front, naming the key to change."""
    taken = urlsplit(proxy.url).port
    cfg = load_config(None, [f"endpoint.url={stub.url}", f"proxy.port={taken}", "proxy.health_interval_s=0"])
    log = tmp_path / "logs" / "proxy.log"
    with pytest.raises(ServiceError, match=rf"proxy.port={taken}: something already listens.*proxy.port=<port>"):
        with proxy_process(cfg, tmp_path / "logs" / "proxy.yaml", tmp_path / "other" / "turns", log):
            pass
    assert not log.exists(), "no proxy was started"
    assert requests.get(f"http://127.0.0.1:{taken}/health", timeout=10).ok, "the first run's proxy still answers"
