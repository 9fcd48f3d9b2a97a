"""A 2-round loop in object storage (SeaweedFS on 127.0.0.1), killed (SIGKILL, its process group)
once round 0's train is in the bucket, then resumed on another machine (an empty mirror): real
harbor trials in bubblewrap through the recording proxy, real convert, real LoRA training of
the embedded model, publishing to the vLLM-format stub (runtime LoRAs, /v1/models roots). The
resumed loop finishes, every health check of both rounds passes, and round 0 is not trained again.

The stub is the endpoint so that the loop costs seconds: its log-probs are not the trained model's,
so the trainer-vs-endpoint mismatch check is off here (loop.health.max_served_mismatch=0); every
other check runs."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from conftest import REPO, free_port, kill_when
from testing.vllm_stub import StubServer
from wharf import schema, storage
from wharf.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")]

CONFIG = REPO / "configs/default.yaml"
TASKS = Path(__file__).parent / "fixtures" / "tasks"


def _args(runs: str, name: str, stub_url: str, *extra: str) -> list[str]:
    # seed 2: the stub's replies (a function of seed and prompt) give both rounds mixed rewards (1/4, 2/4)
    return [f"runs_dir={runs}", f"name={name}", "rounds=2", f"collect.dataset={TASKS}", "collect.tasks=[answer]",
            "collect.agent=tests.fixtures.agents:CoinAgent", "collect.attempts=4", "collect.concurrency=4",
            "sampling.seed=2", f"endpoint.url={stub_url}", "endpoint.model=stub-model", "endpoint.launch=false",
            f"proxy.port={free_port()}", "train.rows_per_step=4", "train.device=cpu",
            "convert.max_tokens_per_batch=512", "loop.health.max_served_mismatch=0", *extra]


def _kill_once_round_0_trained(args: list[str], run: str, mirror: Path, log: Path, timeout: float = 600) -> None:
    """`wharf loop` on a first machine (its own mirror), SIGKILLed once the bucket holds round 0's
    train marker (pushed after the adapter)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "WHARF_MIRROR": str(mirror)}
    cmd = [sys.executable, "-m", "pipeline.cli", "loop", "--config", str(CONFIG), *args]
    kill_when(cmd, lambda: "train.json" in storage.listing(f"{run}/rounds/0/done"), log, "round 0 trained",
              timeout, env=env)


def _digest(url: str) -> str:
    return hashlib.sha256(storage.get(url)).hexdigest()


def _killed_and_resumed_elsewhere(s3: str, name: str, stub: StubServer, monkeypatch, tmp_path, *extra: str) -> str:
    from pipeline.loop import run_loop

    runs, run = f"{s3}/runs", f"{s3}/runs/{name}"
    _kill_once_round_0_trained(_args(runs, name, stub.url, *extra), run, tmp_path / f"{name}-first", tmp_path / f"{name}.log")
    adapter0 = f"{run}/rounds/0/train/adapter/adapter_model.safetensors"
    before = {"adapter": _digest(adapter0), "marker": storage.get(f"{run}/rounds/0/done/train.json"),
              "metrics": storage.get(f"{run}/rounds/0/train/metrics.jsonl")}

    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / f"{name}-second"))  # another machine: nothing local
    assert run_loop(load_config(CONFIG, _args(runs, name, stub.url, *extra))) == [0, 1]

    # round 0 was not trained again: the same adapter, marker and steps in the bucket
    assert before == {"adapter": _digest(adapter0), "marker": storage.get(f"{run}/rounds/0/done/train.json"),
                      "metrics": storage.get(f"{run}/rounds/0/train/metrics.jsonl")}
    for k in (0, 1):
        checks = json.loads(storage.get(f"{run}/rounds/{k}/health.json"))
        assert len(checks) == 5 and all(c["ok"] for c in checks), (k, checks)
        assert json.loads(storage.get(f"{run}/rounds/{k}/done/train.json"))["steps"] > 0, k  # both rounds trained
    assert _digest(f"{run}/rounds/1/train/adapter/adapter_model.safetensors") != before["adapter"]
    assert json.loads(storage.get(f"{run}/rounds/1/done/publish.json"))["policy"] == "policy-v2"
    assert "policy-v2" in stub.stub.adapters  # left serving the newest policy
    return run


def test_an_s3_loop_killed_after_round_0_trained_finishes_on_another_machine(s3, monkeypatch, tmp_path):
    with StubServer(loras=True) as stub:
        run = _killed_and_resumed_elsewhere(s3, "sync", stub, monkeypatch, tmp_path)
    manifest = json.loads(storage.get(f"{run}/rounds/1/collect/manifest.json"))
    assert manifest["policy"] == "policy-v1" and manifest["state"] == "done"
    turns = storage.local_path(f"{run}/rounds/1/collect/turns")
    assert {t["policy"] for t in schema.read_dir(turns, "turns").to_pylist()} == {"policy-v1"}
