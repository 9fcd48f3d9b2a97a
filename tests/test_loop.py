"""The loop end to end on a tiny subset of datasets/learn: real engine, real harbor trials in
bubblewrap, real convert, real LoRA training and publishing.

One 2-round loop is killed (SIGKILL, the whole process group) during round 1's train and run
again; round 1 was sampled by policy-v1; training round 1 again uninterrupted from the same data
gives the same adapter; and a finished loop run against a restarted endpoint leaves it serving
the latest policy again.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from wharf.core import procs, schema
from wharf.core.config import load_config
from wharf.core.endpoint import Endpoint
from wharf.core.layout import RunLayout
from conftest import REPO, free_port, kill_when
from wharf.pipeline.loop import run_loop
from wharf.pipeline.stages import read_marker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400),  # two rounds, a kill, a resume, a replay
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")]

TASKS = "[sed-sub,echo-number,sed-world]"  # mixed rewards at seed 0 on round 0 (3 attempts, and 4)


def _overrides(tmp_path: Path, name: str, engine_port: int) -> list[str]:
    return [f"runs_dir={tmp_path}", f"name={name}", "rounds=2", f"collect.tasks={TASKS}", "collect.attempts=3",
            "collect.concurrency=12", f"engine.port={engine_port}", f"endpoint.url=http://127.0.0.1:{engine_port}",
            f"proxy.port={free_port()}", "train.rows_per_step=2", "convert.max_tokens_per_batch=512",
            "endpoint.launch=false"]


def _engine(port: int, log: Path, *overrides: str) -> subprocess.Popen:
    proc = procs.spawn([sys.executable, "-m", "wharf.engine", "--config", str(REPO / "configs/learn.yaml"),
                        f"engine.port={port}", "engine.threads=2", *overrides], log, cwd=REPO)
    Endpoint(f"http://127.0.0.1:{port}").wait_healthy(300, proc, log)
    return proc


def _adapter(run: RunLayout, k: int) -> dict[str, torch.Tensor]:
    return load_file(str(run.round(k).train.adapter / "adapter_model.safetensors"))


def _kill_during_train(cmd: list[str], run: RunLayout, log: Path, timeout: float = 1500) -> None:
    """Start the loop, SIGKILL it once round 1's train has finished a step (of at least two)."""
    metrics = run.round(1).train.metrics
    kill_when(cmd, lambda: metrics.exists() and metrics.read_text().count("\n") >= 1, log,
              "round 1 trained a step", timeout, interval=0.5)


def test_loop_two_rounds_killed_in_train_resumes_to_the_same_adapter(tmp_path):
    port = free_port()
    engine = _engine(port, tmp_path / "engine.log")
    try:
        args = _overrides(tmp_path, "loop", port)
        run = RunLayout(tmp_path / "loop")
        cmd = [sys.executable, "-m", "wharf.pipeline.cli", "loop", "--config", str(REPO / "configs/learn.yaml"), *args]
        _kill_during_train(cmd, run, tmp_path / "killed.log")
        assert read_marker(run.round(1), "convert") and read_marker(run.round(1), "train") is None

        assert run_loop(load_config(REPO / "configs/learn.yaml", args)) == [0, 1]  # resumes in round 1's train
        for k, policy in ((0, "smollm2-135m"), (1, run.policy(1))):  # the run's own names on the fleet
            turns = schema.read_dir(run.round(k).collect.turns, "turns").to_pylist()
            assert turns and {t["policy"] for t in turns} == {policy}
            assert json.loads(run.round(k).collect.manifest.read_text())["policy"] == policy
        assert read_marker(run.round(1), "publish")["policy"] == run.policy(2)
        assert {run.policy(1), run.policy(2)} <= set(Endpoint(f"http://127.0.0.1:{port}").models())

        # policy-v1 scores the same prompt and token differently than the base model did
        first = {}
        for t in schema.read_dir(run.round(0).collect.turns, "turns").to_pylist():
            first[(tuple(t["prompt_token_ids"]), t["completion_token_ids"][0])] = t["completion_logprobs"][0]
        pairs = [(first[key], t["completion_logprobs"][0])
                 for t in schema.read_dir(run.round(1).collect.turns, "turns").to_pylist()
                 if (key := (tuple(t["prompt_token_ids"]), t["completion_token_ids"][0])) in first]
        assert pairs and all(abs(a - b) > 1e-4 for a, b in pairs), pairs

        # round 1 trained again, uninterrupted, from the same data: the same adapter
        shutil.copytree(run.root, tmp_path / "again")
        again = RunLayout(tmp_path / "again")
        shutil.rmtree(again.round(1).train.root)
        for stage in ("train", "publish"):
            again.round(1).marker(stage).unlink()
        for name in (run.policy(1), run.policy(2)):  # the copy is another run: the engine must serve its adapters, not loop's
            Endpoint(f"http://127.0.0.1:{port}").unload_adapter(name)  # (walked again, its finished round 0 keeps its publish record)
        run_loop(load_config(REPO / "configs/learn.yaml", _overrides(tmp_path, "again", port)))
        a, b = _adapter(run, 1), _adapter(again, 1)
        assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
        assert any(not torch.equal(a[k], _adapter(run, 0)[k]) for k in a)  # round 1 did train
    finally:
        procs.stop(engine)

    # a restarted endpoint has forgotten the adapters: the finished loop loads the latest again
    engine = _engine(port, tmp_path / "engine2.log")
    try:
        assert run.policy(2) not in Endpoint(f"http://127.0.0.1:{port}").models()
        run_loop(load_config(REPO / "configs/learn.yaml", _overrides(tmp_path, "loop", port)))
        assert run.policy(2) in Endpoint(f"http://127.0.0.1:{port}").models()
        assert (run.report).is_file()
    finally:
        procs.stop(engine)

    # replay: both rounds (different policies) into a new run, no endpoint
    from wharf.pipeline.replay import check_jobs, replay_config, run_replay

    jobs = check_jobs([str(run.round(0).collect.root), str(run.round(1).collect.root)])
    rcfg = replay_config(load_config(REPO / "configs/learn.yaml", [f"runs_dir={tmp_path}", "name=replay",
                                                                     "endpoint.url=http://127.0.0.1:1", "train.rows_per_step=0"]), jobs)
    out = RunLayout(run_replay(rcfg))
    assert (out.round(0).train.adapter / "adapter_config.json").is_file()
    off = {j["policies"]: j for j in json.loads((out.round(0).train.root / "offpolicy.json").read_text())["jobs"]}
    assert off["smollm2-135m"]["mismatch_mean"] < 1e-3  # the base model's own samples: on-policy
    assert off[run.policy(1)]["mismatch_mean"] > 10 * off["smollm2-135m"]["mismatch_mean"]
    page = out.report.read_text()
    assert "report/offpolicy.png" in page and (out.root / "report/offpolicy.png").is_file()
