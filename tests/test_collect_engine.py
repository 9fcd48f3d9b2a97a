"""`python -m wharf.collect` end to end against the real local engine (SmolLM2-135M on the CPU): our
minimal agent and real mini-swe-agent, recorded and graded; and a killed round resumed."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from wharf.core import schema
from wharf.collect.audit import audit_round
from wharf.core.model_store import resolve_model_dir
from conftest import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
]
REPO = Path(__file__).resolve().parents[1]


def collect_cmd(tmp_path, engine_url, *overrides):
    return [sys.executable, "-m", "wharf.collect", "--config", str(REPO / "configs/default.yaml"),
            f"runs_dir={tmp_path}", "name=t", f"endpoint.url={engine_url}", "endpoint.launch=false",
            f"proxy.port={free_port()}", *overrides]


def run_collect(tmp_path, engine_url, *overrides, timeout=600):
    out = subprocess.run(collect_cmd(tmp_path, engine_url, *overrides), cwd=REPO, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model_dir(None))


def audit(collect_dir, tok):
    return audit_round(collect_dir, lambda ids: tok.decode(ids), tok.eos_token)


def test_minimal_agent_round_is_token_exact(tmp_path, engine_url, tokenizer):
    run_collect(tmp_path, engine_url, "collect.tasks=[write-answer,sed-greeting]", "collect.attempts=2",
                "collect.agent_kwargs={max_turns: 2}", "sampling.max_tokens=48")
    collect_dir = tmp_path / "t/rounds/0/collect"
    rollouts = schema.read_table(collect_dir / "rollouts.parquet", "rollouts").to_pylist()
    assert len(rollouts) == 4
    assert all(r["status"] == "ok" and r["reward"] in (0.0, 1.0) for r in rollouts), rollouts
    report = audit(collect_dir, tokenizer)
    assert report.checked == 4 and report.ok, report.problems
    turns = schema.read_dir(collect_dir / "turns", "turns").to_pylist()
    sampling = json.loads(turns[0]["sampling"])
    assert sampling["temperature"] == 1.0 and sampling["logprobs"] is True and sampling["max_tokens"] <= 48
    # Read from the engine's /metrics around the trials: the second attempt of a task reuses the first's prompt.
    pc = json.loads((collect_dir / "manifest.json").read_text())["prefix_cache"]
    assert 0 < pc["cached_tokens"] < pc["prompt_tokens"] and pc["hit_rate"] == round(
        pc["cached_tokens"] / pc["prompt_tokens"], 4), pc


def test_mini_swe_agent_round_is_recorded_and_graded(tmp_path, engine_url, tokenizer):
    run_collect(tmp_path, engine_url, "collect.tasks=[write-answer]", "collect.attempts=1",
                "collect.agent=wharf.collect.agents.mini_swe:LocalMiniSweAgent",
                "collect.agent_kwargs={step_limit: 2}", "sampling.max_tokens=48")
    collect_dir = tmp_path / "t/rounds/0/collect"
    (row,) = schema.read_table(collect_dir / "rollouts.parquet", "rollouts").to_pylist()
    # SmolLM2 rarely follows mini's format; what must hold is that the trial ran and was graded
    assert row["reward"] is not None, row
    assert row["n_turns"] >= 1
    report = audit(collect_dir, tokenizer)
    assert report.checked == 1 and report.ok, report.problems


def test_killed_round_resumes_without_redoing_finished_rollouts(tmp_path, engine_url):
    overrides = ["collect.dataset=tests/fixtures/tasks", "collect.tasks=[answer]", "collect.attempts=5",
                 "collect.concurrency=1", "collect.agent=tests.fixtures.agents:ScriptedAgent",
                 "collect.agent_kwargs={calls: 1}"]
    rollouts_path = tmp_path / "t/rounds/0/collect/rollouts.parquet"
    proc = subprocess.Popen(collect_cmd(tmp_path, engine_url, *overrides), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if rollouts_path.exists() and schema.read_table(rollouts_path, "rollouts").num_rows >= 2:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the round ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = schema.read_table(rollouts_path, "rollouts").to_pylist()
    assert 2 <= len(before) < 5

    out = run_collect(tmp_path, engine_url, *overrides)
    assert f"({len(before)} resumed)" in out.stdout
    after = schema.read_table(rollouts_path, "rollouts").to_pylist()
    assert sorted(r["attempt"] for r in after) == [0, 1, 2, 3, 4]
    assert {r["rollout_id"] for r in before} <= {r["rollout_id"] for r in after}
    assert all(r["status"] == "ok" for r in after)
    # every kept rollout has exactly its one call on disk; a try cut short by the kill may have
    # left a row under its own (abandoned) rollout id, never under a kept one
    turns = schema.read_dir(tmp_path / "t/rounds/0/collect/turns", "turns").to_pylist()
    for r in after:
        assert sum(t["rollout_id"] == r["rollout_id"] for t in turns) == 1
    assert len({(t["rollout_id"], t["turn"]) for t in turns}) == len(turns)
    # such rows are orphans: counted in the manifest and by the audit, never trained on
    manifest = json.loads((tmp_path / "t/rounds/0/collect/manifest.json").read_text())
    kept = {r["rollout_id"] for r in after}
    assert manifest["orphan_turns"] == sum(t["rollout_id"] not in kept for t in turns)
    assert sum(audit_round(tmp_path / "t/rounds/0/collect").orphan_turns.values()) == manifest["orphan_turns"]
