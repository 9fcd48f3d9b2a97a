"""A warm-started loop round, live: an adapter trained beforehand (as `make mini-sft` trains one)
is loop.init_adapter; round 0 samples it from the real engine as policy-v0 in real sandboxed
trials, and round 0's train continues that LoRA (it does not start a fresh one)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from wharf.core import schema
from wharf.core.config import load_config
from wharf.core.endpoint import Endpoint
from wharf.core.layout import RunLayout
from conftest import REPO, free_port
from wharf.pipeline.loop import run_loop
from wharf.pipeline.stages import read_marker

sys.path.insert(0, str(Path(__file__).parent))
from train_util import adapter_tensors, trained_adapter  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")]

LORA = ["train.lora_rank=4", "train.lora_alpha=8"]  # train_util's: the init adapter's shape


def first_logprobs(ep: Endpoint, model: str) -> list[float]:
    r = ep._json("POST", "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 4,
        "temperature": 0, "logprobs": True, "seed": 0})
    return [e["logprob"] for e in r["choices"][0]["logprobs"]["content"]]


def test_a_warm_started_round_samples_the_init_adapter_and_continues_it(tmp_path, engine_url):
    init = trained_adapter(tmp_path, "sft")  # a stand-in for the SFT run: any trained LoRA
    cfg = load_config(REPO / "configs/learn.yaml", [
        f"runs_dir={tmp_path}", "name=warm", "rounds=1", f"loop.init_adapter={tmp_path / 'sft'}:1", *LORA,
        "collect.tasks=[sed-sub,echo-number]", "collect.attempts=3", "collect.concurrency=6",
        f"endpoint.url={engine_url}", "endpoint.launch=false", f"proxy.port={free_port()}",
        "train.rows_per_step=3", "convert.max_tokens_per_batch=512"])
    ep = Endpoint(engine_url)
    try:
        assert run_loop(cfg) == [0]
        run = RunLayout(tmp_path / "warm")
        turns = schema.read_dir(run.round(0).collect.turns, "turns").to_pylist()
        assert turns and {t["policy"] for t in turns} == {run.policy(0)}
        # policy-v0 on the engine is the init adapter's weights, not the base model's
        assert max(abs(a - b) for a, b in zip(first_logprobs(ep, run.policy(0)),
                                              first_logprobs(ep, cfg.endpoint.model))) > 1e-3
        assert read_marker(run.round(0), "publish")["policy"] == run.policy(1)
        before, after = adapter_tensors(init), adapter_tensors(run.round(0).train.adapter)
        assert before.keys() == after.keys()
        moved = sum((after[k] - before[k]).norm() ** 2 for k in before) ** 0.5
        size = sum(before[k].norm() ** 2 for k in before) ** 0.5
        # continued: policy-v1 is the init adapter plus one round's update (a fresh LoRA would
        # start from B = 0, as far from the init as the init is from nothing)
        assert moved < 0.5 * size, (float(moved), float(size))
        trained = read_marker(run.round(0), "train")
        # these tasks give round 0 mixed rewards: it trains (a round without signal would carry the init on)
        assert trained["steps"] > 0 and moved > 0, trained
    finally:
        for name in (cfg.policy(0), cfg.policy(1)):  # the engine is shared by the session's other tests
            if name in ep.models():
                ep.unload_adapter(name)
