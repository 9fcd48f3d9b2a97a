"""wharf.endpoint against the real engine, and against small fakes of a misconfigured vLLM."""
from __future__ import annotations

import asyncio
import json
import math
import threading

import pytest
from aiohttp import web

from wharf.core.config import load_config
from wharf.engine.launch import launch
from wharf.core.endpoint import Endpoint, EndpointError, parse_prefix_counters
from wharf.collect.manifest import prefix_cache_summary
from conftest import free_port


def test_client_against_the_engine(engine_url, tmp_path):
    ep = Endpoint(engine_url, model="smollm2-135m")
    assert ep.healthy()
    assert ep.models() == ["smollm2-135m"]
    ep.check_capture()
    queries, hits = ep.prefix_cache_counters()  # check_capture's calls were looked up
    assert queries > 0 and 0 <= hits <= queries
    with pytest.raises(EndpointError, match="404: Loading lora x failed: No adapter found"):
        ep.load_adapter("x", tmp_path / "missing")
    with pytest.raises(EndpointError, match="cannot be found"):
        ep.unload_adapter("x")


def test_launch_uses_a_running_endpoint(engine_url):
    cfg = load_config(None, [f"endpoint.url={engine_url}", "endpoint.launch=false"])
    with launch(cfg) as ep:
        assert ep.url == engine_url and ep.models() == ["smollm2-135m"]


def test_launch_refuses_clearly_when_it_cannot_start_anything():
    url = f"http://127.0.0.1:{free_port()}"
    cfg = load_config(None, [f"endpoint.url={url}", "endpoint.launch=false"])
    with pytest.raises(EndpointError, match="endpoint.launch is false"):
        with launch(cfg):
            pass
    cfg = load_config(None, [f"endpoint.url={url}", "endpoint.kind=vllm", "endpoint.model=some/model"])
    with pytest.raises(EndpointError, match=r"pip install -e \.\[vllm\]"):
        with launch(cfg):
            pass
    cfg = load_config(None, [f"endpoint.url={url}", "endpoint.model=other"])
    with pytest.raises(EndpointError, match="engine.served_name"):
        with launch(cfg):
            pass


def test_wait_healthy_times_out_with_a_clear_message():
    ep = Endpoint(f"http://127.0.0.1:{free_port()}")
    assert not ep.healthy()
    with pytest.raises(EndpointError, match="did not answer within 1 s"):
        ep.wait_healthy(1.0)


@pytest.mark.slow
def test_launch_starts_and_stops_the_local_engine(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    cfg = load_config("configs/default.yaml", [f"endpoint.url={url}", "engine.threads=2"])
    with launch(cfg, log_dir=tmp_path) as ep:
        assert ep.models() == ["smollm2-135m"]  # check_capture passed on the way in
    assert not Endpoint(url).healthy(), "the launched engine is still running"
    assert "serving smollm2-135m" in (tmp_path / "endpoint-local.log").read_text()


class FakeVLLM:
    """vLLM's wire format with raw log-probs (its default) or without token ids."""

    def __init__(self, raw: bool, token_ids: bool = True):
        self.raw, self.token_ids = raw, token_ids
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    async def chat(self, request):
        body = await request.json()
        t = 1.0 if self.raw else body["temperature"]
        logits = [2.0, 1.0, 0.5, 0.0, -1.0]
        lse = math.log(sum(math.exp(x / t) for x in logits))
        top = [{"token": f"t{i}", "logprob": x / t - lse, "bytes": [116], "top_logprobs": []}
               for i, x in enumerate(logits)]
        choice = {"index": 0, "message": {"role": "assistant", "content": "t0"}, "finish_reason": "length",
                  "logprobs": {"content": [{**top[0], "top_logprobs": top}]}}
        if self.token_ids:
            choice["token_ids"] = [7]
        return web.json_response({"id": "x", "object": "chat.completion", "model": body["model"],
                                  "choices": [choice], "prompt_token_ids": [1, 2, 3] if self.token_ids else None,
                                  "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})

    async def health(self, request):
        return web.Response()

    def __enter__(self):
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/health", self.health)
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_capture_check_names_the_fix_for_raw_logprobs():
    with FakeVLLM(raw=True) as fake:
        with pytest.raises(EndpointError, match="--logprobs-mode processed_logprobs"):
            Endpoint(fake.url, model="m").check_capture()
        cfg = load_config(None, [f"endpoint.url={fake.url}", "endpoint.kind=vllm", "endpoint.model=m"])
        with pytest.raises(EndpointError, match="processed_logprobs"):
            with launch(cfg):
                pass
    with FakeVLLM(raw=False) as fake:
        Endpoint(fake.url, model="m").check_capture()  # processed: the spread doubles at T=0.5
    with FakeVLLM(raw=False, token_ids=False) as fake:
        with pytest.raises(EndpointError, match="prompt_token_ids"):
            Endpoint(fake.url, model="m").check_capture()


def test_a_vllm_tool_parser_that_is_not_the_models_format_is_refused_before_launch(tmp_path):
    """A Llama 3 model dir whose template renders tools, served with hermes (configs/vllm.yaml's, for
    Qwen2.5): every call would stay text. Refused in one line before vLLM starts; llama3_json passes
    on to the next check (vllm is not installed here); a template of the user's, or one without tools, is theirs."""
    from wharf.engine.launch import check_endpoint

    model = tmp_path / "llama-3.2-1b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% if tools %}{{ tools | tojson }}{% endif %}"}))
    url = f"http://127.0.0.1:{free_port()}"

    def check(*args: str) -> str:
        cfg = load_config(None, [f"endpoint.url={url}", "endpoint.kind=vllm", f"endpoint.model={model}"])
        cfg.endpoint.vllm_args = ["--enable-auto-tool-choice", *args]
        with pytest.raises(EndpointError) as e:
            check_endpoint(cfg)
        return str(e.value)

    assert check("--tool-call-parser=hermes") == (
        f"endpoint.vllm_args has --tool-call-parser=hermes, but {model} is a Llama model whose chat template asks "
        "for llama3_json tool calls: vLLM would read none of them; set --tool-call-parser=llama3_json, or pass the "
        "--chat-template that asks for hermes calls")
    assert "pip install -e .[vllm]" in check("--tool-call-parser", "hermes", "--chat-template", "mine.jinja")
    assert "pip install -e .[vllm]" in check("--tool-call-parser=llama3_json")
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert "pip install -e .[vllm]" in check("--tool-call-parser=hermes")


def test_prefix_counters_are_read_as_vllm_writes_them():
    page = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1200.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 800.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 900.0 1700000000000
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 100.0
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e9
"""
    assert parse_prefix_counters(page) == (2000.0, 1000.0)
    assert parse_prefix_counters("vllm:prefix_cache_queries_total 5\n") is None  # no hits counter: cache off
    assert parse_prefix_counters("") is None


def test_round_prefix_cache_summary_is_the_difference():
    assert prefix_cache_summary((100, 40), (1100, 790)) == {"prompt_tokens": 1000, "cached_tokens": 750,
                                                            "hit_rate": 0.75}
    # a resumed round adds its earlier runs' figures
    prev = {"prompt_tokens": 1000, "cached_tokens": 750, "hit_rate": 0.75}
    assert prefix_cache_summary((0, 0), (1000, 250), prev) == {"prompt_tokens": 2000, "cached_tokens": 1000,
                                                              "hit_rate": 0.5}
    assert prefix_cache_summary((100, 40), (50, 0)) is None  # the endpoint restarted during the round
    assert prefix_cache_summary((100, 40), None) is None
    assert prefix_cache_summary((100, 40), (100, 40))["hit_rate"] is None  # no calls
