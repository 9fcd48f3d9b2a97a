"""A 2-round loop in object storage (SeaweedFS on 127.0.0.1), killed (SIGKILL, its process group),
then resumed on another machine (an empty mirror): real harbor trials in bubblewrap through the
recording proxy, real convert, real LoRA training of the embedded model, publishing to the
vLLM-format stub (runtime LoRAs, /v1/models roots). The synchronous loop is killed once round 0's
train is in the bucket; the overlapped one (loop.max_staleness=1) while round 1's collect and
round 0's train both run. Each resumed loop finishes, every health check of both rounds passes,
and nothing is collected or trained twice.

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
from wharf.collect.proxy.forward import call_seed
from wharf.core.layout import RunLayout
from wharf.collect.tasksets import PlannedRollout, discover, rollout_seed
from wharf.pipeline.health_checks import CHECKS
from testing.vllm_stub import StubServer
from wharf.core import schema, storage
from wharf.core.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")]

CONFIG = REPO / "configs/default.yaml"
TASKS = Path(__file__).parent / "fixtures" / "tasks"
# seed 2: the stub's replies (a function of seed and prompt) give both rounds mixed rewards (1/4, 2/4)
SEED, ATTEMPTS = 2, 4


def _args(runs: str, name: str, stub_url: str, *extra: str) -> list[str]:
    return [f"runs_dir={runs}", f"name={name}", "rounds=2", f"collect.dataset={TASKS}", "collect.tasks=[answer]",
            "collect.agent=tests.fixtures.agents:CoinAgent", f"collect.attempts={ATTEMPTS}", "collect.concurrency=4",
            f"sampling.seed={SEED}", f"endpoint.url={stub_url}", "endpoint.model=stub-model", "endpoint.launch=false",
            "loop.check_model=false",  # the stub's toy tokens are not the model's
            f"proxy.port={free_port()}", "train.rows_per_step=4", "train.device=cpu",
            "convert.max_tokens_per_batch=512", "loop.health.max_served_mismatch=0", *extra]


def _loop_cmd(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "wharf.pipeline.cli", "loop", "--config", str(CONFIG), *args]


def _first_machine(mirror: Path) -> dict:
    """The environment of `wharf loop` on a first machine: its own mirror."""
    return {**os.environ, "PYTHONPATH": str(REPO), "WHARF_MIRROR": str(mirror)}


def _kill_once_round_0_trained(args: list[str], run: str, mirror: Path, log: Path, timeout: float = 600) -> None:
    """`wharf loop` on a first machine, SIGKILLed once the bucket holds round 0's train marker
    (pushed after the adapter)."""
    kill_when(_loop_cmd(args), lambda: "train.json" in storage.listing(f"{run}/rounds/0/done"), log,
              "round 0 trained", timeout, env=_first_machine(mirror))


def _digest(url: str) -> str:
    return hashlib.sha256(storage.get(url)).hexdigest()


def _resumed_elsewhere(run: str, args: list[str], stub: StubServer, monkeypatch, mirror: Path) -> None:
    """The loop run again on another machine (an empty mirror): it finishes, every health check of
    both rounds passes, both rounds trained, and the endpoint is left serving the newest policy."""
    from wharf.pipeline.loop import run_loop

    monkeypatch.setenv("WHARF_MIRROR", str(mirror))  # another machine: nothing local
    assert run_loop(load_config(CONFIG, args)) == [0, 1]
    for k in (0, 1):
        checks = json.loads(storage.get(f"{run}/rounds/{k}/health.json"))
        assert len(checks) == len(CHECKS) and all(c["ok"] for c in checks), (k, checks)
        assert json.loads(storage.get(f"{run}/rounds/{k}/done/train.json"))["steps"] > 0, k  # both rounds trained
    name = RunLayout.of(run.rpartition("/")[0], run.rpartition("/")[2]).policy(2)  # the run's own name, from its URL
    assert json.loads(storage.get(f"{run}/rounds/1/done/publish.json"))["policy"] == name
    assert name in stub.stub.adapters  # left serving the newest policy


def _turn_policies(run: str) -> set:
    turns = storage.local_path(f"{run}/rounds/1/collect/turns")
    return {t["policy"] for t in schema.read_dir(turns, "turns").to_pylist()}


# Secrets of the run (the endpoint's key, the proxy's admin token, an agent's credential): no object
# of the run in the bucket may hold one.
SECRETS = {"endpoint.api_key": "wharf-test-endpoint-key-6f1d", "proxy.admin_token": "wharf-test-admin-token-93ab",
           "collect.agent_env": "{WHARF_TEST_API_KEY: wharf-test-agent-key-c27e, WHARF_TEST_REGION: wharf-test-env-5d10}"}


def _secrets_in_bucket(run: str) -> list[str]:
    values = ["wharf-test-endpoint-key-6f1d", "wharf-test-admin-token-93ab", "wharf-test-agent-key-c27e",
              "wharf-test-env-5d10"]
    keys = storage.listing(run)
    assert len(keys) > 50, keys  # the whole run: rounds, trials' logs, adapters, configs
    return [f"{k}: {v}" for k in keys for v in values if v.encode() in storage.get(f"{run}/{k}")]


def test_an_s3_loop_killed_after_round_0_trained_finishes_on_another_machine(s3, monkeypatch, tmp_path):
    runs, run = f"{s3}/runs", f"{s3}/runs/sync"
    with StubServer(loras=True, api_key=SECRETS["endpoint.api_key"]) as stub:
        args = _args(runs, "sync", stub.url, *(f"{k}={v}" for k, v in SECRETS.items()))
        _kill_once_round_0_trained(args, run, tmp_path / "first", tmp_path / "killed.log")
        adapter0 = f"{run}/rounds/0/train/adapter/adapter_model.safetensors"
        before = {"adapter": _digest(adapter0), "marker": storage.get(f"{run}/rounds/0/done/train.json"),
                  "metrics": storage.get(f"{run}/rounds/0/train/metrics.jsonl")}
        _resumed_elsewhere(run, args, stub, monkeypatch, tmp_path / "second")

    # round 0 was not trained again: the same adapter, marker and steps in the bucket
    assert before == {"adapter": _digest(adapter0), "marker": storage.get(f"{run}/rounds/0/done/train.json"),
                      "metrics": storage.get(f"{run}/rounds/0/train/metrics.jsonl")}
    assert _digest(f"{run}/rounds/1/train/adapter/adapter_model.safetensors") != before["adapter"]
    manifest = json.loads(storage.get(f"{run}/rounds/1/collect/manifest.json"))
    v1 = RunLayout.of(run.rpartition("/")[0], run.rpartition("/")[2]).policy(1)
    assert manifest["policy"] == v1 and manifest["state"] == "done"
    assert _turn_policies(run) == {v1}
    assert not _secrets_in_bucket(run)


# The overlapped loop: the stub holds round 1's attempts 2 and 3 (the calls with their seeds), so
# that its collect is mid-round, attempts 0 and 1 finished, for as long as round 0's train takes
# to log a step.
HELD, CALLS = (2, 3), 2  # CoinAgent's calls a rollout


def _held_seeds() -> set[int]:
    """The seeds the proxy sends for round 1's held attempts, each of their calls."""
    (task,) = discover(TASKS, ["answer"])
    firsts = {rollout_seed(SEED, 1, PlannedRollout(task, a)) for a in HELD}
    return {call_seed(s, turn) for s in firsts for turn in range(CALLS)}


def _rows(url: str) -> list[dict]:
    """The bucket's rollouts table (through this process's mirror); [] before it has one."""
    local = storage.local_path(url)
    storage.pull_file(local)
    return schema.read_table(local, "rollouts").to_pylist() if local.is_file() else []


def _both_halves_running(stub: StubServer, run: str, mirror: Path) -> bool:
    """Round 1's collect waits on the stub with its other rollouts in the bucket, and round 0's train
    (on the first machine's mirror) has logged an optimizer step."""
    metrics = mirror / storage.local_path(f"{run}/rounds/0/train/metrics.jsonl").relative_to(storage.mirror_root())
    return (stub.stub.held > 0 and metrics.is_file() and metrics.read_text().count("\n") >= 1
            and len(_rows(f"{run}/rounds/1/collect/rollouts.parquet")) == ATTEMPTS - len(HELD))


def test_an_overlapped_s3_loop_killed_in_both_halves_finishes_on_another_machine(s3, monkeypatch, tmp_path):
    runs, run, first = f"{s3}/runs", f"{s3}/runs/overlap", tmp_path / "first"
    held = _held_seeds()
    with StubServer(loras=True, hold=lambda body: body.get("seed") in held) as stub:
        # one row a micro-batch and a step: round 0's train is killed between steps
        args = _args(runs, "overlap", stub.url, "loop.max_staleness=1", "train.rows_per_step=1",
                     "convert.max_tokens_per_batch=96")
        kill_when(_loop_cmd(args), lambda: _both_halves_running(stub, run, first), tmp_path / "killed.log",
                  "round 1's collect and round 0's train at once", 600, env=_first_machine(first), tree=True)
        before = json.loads(storage.get(f"{run}/rounds/1/collect/manifest.json"))
        kept = _rows(f"{run}/rounds/1/collect/rollouts.parquet")
        assert before["state"] == "running" and len(kept) == ATTEMPTS - len(HELD)
        assert "train.json" not in storage.listing(f"{run}/rounds/0/done")  # killed mid-train
        stub.stub.release()
        _resumed_elsewhere(run, args, stub, monkeypatch, tmp_path / "second")

    # round 1's collect resumed its job with its policy, kept its finished rollouts, ran each (task, attempt) once
    after = json.loads(storage.get(f"{run}/rounds/1/collect/manifest.json"))
    assert after["job_id"] == before["job_id"] and after["policy"] == before["policy"] == "stub-model"
    assert after["state"] == "done"
    rows = _rows(f"{run}/rounds/1/collect/rollouts.parquet")
    keys = [(r["task_id"], r["attempt"]) for r in rows]
    assert len(keys) == ATTEMPTS and len(set(keys)) == ATTEMPTS
    assert all(r in rows for r in kept)
    assert _turn_policies(run) == {"stub-model"}
    assert json.loads(storage.get(f"{run}/rounds/1/done/collect.json"))["lag"] == 1  # one policy behind
    # round 0's train, cut after a step, ran whole once on the second machine: each step once
    result = json.loads(storage.get(f"{run}/rounds/0/train/result.json"))
    steps = [json.loads(line)["step"] for line in storage.get(f"{run}/rounds/0/train/metrics.jsonl").splitlines()]
    assert result["steps"] > 1 and steps == list(range(1, result["steps"] + 1))
