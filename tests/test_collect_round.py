"""Collect rounds with real harbor trials in the bubblewrap sandbox and the real recording proxy.

The agents here are scripted (tests/fixtures/agents.py) so that each failure mode happens on
purpose; the endpoint is the vLLM-format stub or a dead port.
"""
from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from testing.vllm_stub import StubServer
from wharf.core import schema
from wharf.core.config import load_config
from wharf.collect.runner import Round
from conftest import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
]

TASKS = Path(__file__).parent / "fixtures" / "tasks"
AGENTS = "tests.fixtures.agents"


def round_cfg(tmp_path, agent, endpoint_url, *extra):
    return load_config(None, [
        f"runs_dir={tmp_path}", "name=t", f"endpoint.url={endpoint_url}", "endpoint.model=stub-model",
        f"proxy.port={free_port()}", f"collect.dataset={TASKS}", f"collect.agent={AGENTS}:{agent}",
        "collect.concurrency=2", *extra,
    ])


def run_round(cfg, tmp_path):
    config_path = tmp_path / "config.yaml"
    from wharf.core.config import dump_config

    dump_config(cfg, config_path)
    summary = asyncio.run(Round(cfg, config_path).run(progress=False))
    rollouts = schema.read_table(cfg.round_dir() / "collect" / "rollouts.parquet", "rollouts").to_pylist()
    turns = schema.read_dir(cfg.round_dir() / "collect" / "turns", "turns").to_pylist()
    manifest = json.loads((cfg.round_dir() / "collect" / "manifest.json").read_text())
    return summary, rollouts, turns, manifest


@pytest.fixture(scope="module")
def stub():
    server = StubServer().start()
    yield server.url
    server.stop()


def test_ok_round_records_every_call(tmp_path, stub):
    cfg = round_cfg(tmp_path, "ScriptedAgent", stub, "collect.tasks=[answer]", "collect.attempts=3",
                    "collect.agent_kwargs={calls: 2}")
    summary, rollouts, turns, manifest = run_round(cfg, tmp_path)
    assert [r["status"] for r in rollouts] == ["ok"] * 3
    assert all(r["reward"] == 1.0 and r["n_turns"] == 2 for r in rollouts)
    assert len({r["rollout_id"] for r in rollouts}) == 3
    assert {r["group_id"] for r in rollouts} == {f"{summary.job_id[:8]}.answer"}
    # every model call of every rollout is a turns row, in order, with the policy that served it
    for r in rollouts:
        mine = sorted((t for t in turns if t["rollout_id"] == r["rollout_id"]), key=lambda t: t["turn"])
        assert [t["turn"] for t in mine] == [0, 1]
        assert all(t["status"] == "ok" and t["policy"] == "stub-model" for t in mine)
        trajectory = json.loads((cfg.round_dir() / "collect" / r["trial_dir"] / "agent" / "trajectory.json").read_text())
        assert len(trajectory) == len(mine)
        for t, call in zip(mine, trajectory):
            assert json.loads(t["response"])["choices"][0]["message"]["content"] == call["assistant"]
            assert len(t["completion_token_ids"]) == len(t["completion_logprobs"]) > 0
    assert manifest["state"] == "done" and manifest["counts"]["by_status"] == {"ok": 3}
    # one shard per closed rollout while the round ran, folded into one at its end
    assert len(schema.shard_files(cfg.round_dir() / "collect" / "turns")) == 1
    assert manifest["success_rate_by_task"] == {"answer": 1.0}
    assert manifest["orphan_turns"] == 0 and manifest["orphan_rollouts"] == 0
    # running the finished round again changes nothing and starts nothing
    again, rollouts2, _, manifest2 = run_round(cfg, tmp_path)
    assert again.resumed == 3 and rollouts2 == rollouts
    assert manifest2["job_id"] == manifest["job_id"] and manifest2["wall_s"] >= manifest["wall_s"]


def test_failures_are_classified_and_the_round_completes(tmp_path, stub):
    dead = f"http://127.0.0.1:{free_port()}"
    cases = [
        ("CrashingAgent", stub, ["collect.tasks=[answer]"], "agent_error", None),
        ("SleepingAgent", stub, ["collect.tasks=[answer]", "collect.agent_timeout_s=2"], "agent_timeout", 0.0),
        ("ScriptedAgent", stub, ["collect.tasks=[broken-verifier]"], "verifier_error", None),
        ("ScriptedAgent", dead, ["collect.tasks=[answer]", "proxy.upstream_timeout_s=5"], "infra_error", None),
    ]
    for i, (agent, url, extra, status, reward) in enumerate(cases):
        cfg = round_cfg(tmp_path / str(i), agent, url, "collect.attempts=1", *extra)
        _, rollouts, turns, manifest = run_round(cfg, tmp_path / str(i))
        (row,) = rollouts
        assert (row["status"], row["reward"]) == (status, reward), row
        assert row["error"], row
        assert manifest["state"] == "done"
        # the upstream call errors the proxy saw are in the row: 1 for the dead endpoint, else none
        assert row["n_errors"] == (1 if status == "infra_error" else 0), row
        if status == "infra_error":
            # the failed call is on record, as an error row
            assert [t["status"] for t in turns] == ["error"] and turns[0]["error"]


def test_manifest_counts_orphan_turns_left_by_a_killed_run(tmp_path, stub):
    cfg = round_cfg(tmp_path, "ScriptedAgent", stub, "collect.tasks=[answer]", "collect.attempts=1")
    turns_dir = cfg.round_dir() / "collect" / "turns"
    # A trial of an earlier, killed run: its calls were recorded, its rollouts row never written.
    from wharf.collect.proxy.shards import write_shard
    ghost = {"rollout_id": "killed-run-trial", "turn": 0, "request_id": "r0", "api": "chat", "policy": "stub-model",
             "started_at": 0.0, "ended_at": 1.0, "request": "{}", "response": "{}", "sampling": "{}",
             "prompt_token_ids": [1, 2], "completion_token_ids": [3], "completion_logprobs": [-0.5],
             "finish_reason": "stop", "status": "ok", "error": None}
    turns_dir.mkdir(parents=True)
    write_shard(turns_dir / "part-00000000T000000-ghost.parquet", [ghost, {**ghost, "turn": 1, "request_id": "r1"}])
    _, rollouts, turns, manifest = run_round(cfg, tmp_path)
    assert len(rollouts) == 1 and len(turns) == 2 + rollouts[0]["n_turns"]
    assert manifest["orphan_turns"] == 2 and manifest["orphan_rollouts"] == 1
