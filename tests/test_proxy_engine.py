"""The proxy in front of the real local engine (SmolLM2-135M on the CPU), driven by the real openai client.

A tap between the proxy and the engine keeps the engine's raw answers, so the rows are compared
with what the engine really returned, not with a re-run.
"""
from __future__ import annotations

import asyncio
import json
import threading

import aiohttp
import openai
import pytest
import requests
from aiohttp import web

from wharf.core.config import load_config
from wharf.collect.proxy.background import BackgroundProxy
from wharf.core.schema import read_dir

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                           "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                          "required": ["command"]}}}]


class Tap:
    """A pass-through HTTP server that records every raw answer of the upstream, in order."""

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.answers: list[tuple[dict, bytes]] = []
        self.loop = asyncio.new_event_loop()
        self.url = ""

    async def _forward(self, request: web.Request) -> web.Response:
        body = await request.read()
        async with aiohttp.ClientSession() as s:
            async with s.request(request.method, self.upstream + request.path, data=body,
                                 headers={"Content-Type": "application/json"}) as r:
                raw = await r.read()
                ctype = r.headers.get("Content-Type", "application/json")
                status = r.status
        if request.path.endswith("/chat/completions"):
            self.answers.append((json.loads(body), raw))
        return web.Response(body=raw, status=status, headers={"Content-Type": ctype})

    def start(self) -> "Tap":
        ready = threading.Event()

        async def boot():
            app = web.Application(client_max_size=1 << 26)
            app.router.add_route("*", "/{tail:.*}", self._forward)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
            ready.set()

        threading.Thread(target=lambda: (self.loop.run_until_complete(boot()), self.loop.run_forever()),
                         daemon=True).start()
        assert ready.wait(10)
        return self


def engine_view(sent: dict, raw: bytes) -> dict:
    """What the engine returned: ids and log-probs, from a JSON answer or an SSE stream."""
    if not sent.get("stream"):
        d = json.loads(raw)
        c = d["choices"][0]
        return {"prompt": d["prompt_token_ids"], "ids": c["token_ids"],
                "lps": [e["logprob"] for e in c["logprobs"]["content"]], "finish": c["finish_reason"]}
    out = {"prompt": None, "ids": [], "lps": [], "finish": None}
    for line in raw.split(b"\n"):
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        d = json.loads(line[6:])
        out["prompt"] = out["prompt"] or d.get("prompt_token_ids")
        for c in d.get("choices") or ():
            out["ids"] += c.get("token_ids") or []
            out["lps"] += [e["logprob"] for e in (c.get("logprobs") or {}).get("content") or []]
            out["finish"] = c.get("finish_reason") or out["finish"]
    return out


def run_conversation(client, stream: bool) -> None:
    """Three calls: the agent's tool call and its result are in the history of calls 2 and 3."""
    msgs = [{"role": "system", "content": "You are a shell agent. Answer with one bash tool call."},
            {"role": "user", "content": "How many files are in the current directory?"}]
    for i in range(3):
        kw = dict(model="my-agent", messages=msgs, tools=TOOLS, seed=100 + i, max_tokens=12)
        if stream:
            text = "".join(ch.choices[0].delta.content or "" for ch in
                           client.chat.completions.create(stream=True, **kw) if ch.choices)
        else:
            out = client.chat.completions.create(**kw)
            assert out.model == "my-agent"
            text = out.choices[0].message.content or ""
        if i == 0:
            msgs = msgs + [
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                                                       "function": {"name": "bash", "arguments": '{"command": "ls | wc -l"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
        else:
            msgs = msgs + [{"role": "assistant", "content": text}, {"role": "user", "content": "Are you sure?"}]


@pytest.mark.slow
def test_engine_conversation_rows_match_engine_streaming_and_not(engine_url, tmp_path):
    tap = Tap(engine_url).start()
    cfg = load_config(None, [f"endpoint.url={tap.url}", "proxy.port=0", f"proxy.out_dir={tmp_path}/turns",
                             "proxy.health_interval_s=0", "sampling.temperature=1.0", "sampling.top_p=1.0"])
    with BackgroundProxy(cfg) as p:
        for rid, stream in (("full", False), ("stream", True)):
            admin = {"Authorization": f"Bearer {p.admin_token}"}  # drawn by the proxy: none configured
            info = requests.post(f"{p.admin_url}/admin/rollouts", json={"rollout_id": rid}, headers=admin).json()
            run_conversation(openai.OpenAI(base_url=info["base_url"], api_key=info["api_key"], max_retries=0), stream)
            res = requests.post(f"{p.admin_url}/admin/rollouts/{rid}/close", headers=admin).json()
            assert res == {"rollout_id": rid, "n_turns": 3, "n_errors": 0, "published": True}
    rows = read_dir(tmp_path / "turns", "turns").to_pylist()
    assert len(tap.answers) == 6 and len(rows) == 6
    by = {(r["rollout_id"], r["turn"]): r for r in rows}
    for k, (sent, raw) in enumerate(tap.answers):
        row = by[("full" if k < 3 else "stream", k % 3)]
        eng = engine_view(sent, raw)
        assert row["status"] == "ok" and row["policy"] == cfg.endpoint.model
        assert json.loads(row["sampling"]) == {key: v for key, v in sent.items() if key not in ("messages", "tools")}
        assert sent["return_token_ids"] and sent["logprobs"] and sent["model"] == cfg.endpoint.model
        assert row["prompt_token_ids"] == eng["prompt"]
        assert row["completion_token_ids"] == eng["ids"] and len(eng["ids"]) > 0
        assert row["completion_logprobs"] == pytest.approx(eng["lps"], rel=1e-6, abs=1e-6)
        assert row["finish_reason"] == eng["finish"]
    # The tool call in the history is in the prompt ids of the later calls (hermes markup).
    assert len(by[("full", 1)]["prompt_token_ids"]) > len(by[("full", 0)]["prompt_token_ids"])
    # Same seeds, same conversation: streaming and non-streaming record the same rows.
    cols = ("turn", "prompt_token_ids", "completion_token_ids", "finish_reason")
    for t in range(3):
        a, b = by[("full", t)], by[("stream", t)]
        assert {c: a[c] for c in cols} == {c: b[c] for c in cols}, f"turn {t}"
        assert a["completion_logprobs"] == pytest.approx(b["completion_logprobs"], abs=1e-4)
