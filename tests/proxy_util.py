"""What the proxy tests share: a configured proxy on the stub, rollouts opened and closed through
the admin API, rows read back, and a three-call tool-using conversation."""
from __future__ import annotations

import pytest
import requests

from wharf.collect.proxy.background import BackgroundProxy
from wharf.collect.proxy.wal import read_records
from wharf.core.config import load_config
from wharf.core.schema import read_dir

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
                              "sampling.top_p=0.9", "sampling.top_p_uncorrected=true", "endpoint.model=base-model",
                              f"proxy.admin_token={ADMIN_TOKEN}",
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
