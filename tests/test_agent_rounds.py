"""`make collect` with the real claude-code, codex, opencode, qwen-code and gemini-cli CLIs (make
agents), and mistral-vibe, aider and OpenHands (make agents-py): a round end to end in the default (bubblewrap) sandbox
against the scripted stub, every trial classified, every row matching the agent's own log (the audit)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from testing.vllm_stub import StubServer
from wharf.core import schema
from wharf.collect.agents.logs import compare, read_agent_log
from wharf.collect.audit import audit_round
from conftest import REPO, free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
]


@pytest.fixture(scope="module")
def stub():
    with StubServer(script="shell:echo hello > hello.txt", max_model_len=131072) as s:
        yield s.url


# agent: (its API, calls per trial, side calls among them, reward): opencode titles its session on
# the side; aider has no tools (it edits files from the answer's text), so the stub's answer would
# not do its task.
AGENTS = {"wharf.collect.agents.claude_code:LocalClaudeCode": ("anthropic", 2, 0, 1.0),
          "wharf.collect.agents.codex:LocalCodex": ("responses", 2, 0, 1.0),
          "wharf.collect.agents.opencode:LocalOpenCode": ("responses", 3, 1, 1.0),
          "wharf.collect.agents.qwen_code:LocalQwenCode": ("chat", 2, 0, 1.0),
          "wharf.collect.agents.gemini_cli:LocalGeminiCli": ("gemini", 2, 0, 1.0),
          "wharf.collect.agents.vibe:LocalVibe": ("chat", 2, 0, 1.0),
          "wharf.collect.agents.aider:LocalAider": ("chat", 1, 0, 0.0)}


@pytest.mark.parametrize("agent", list(AGENTS))
def test_make_collect_round_with_a_cli_agent(tmp_path, stub, agent):
    check_round(tmp_path, stub, agent, *AGENTS[agent])


def test_make_collect_round_with_openhands(tmp_path, stub):
    # it re-asks after an answer without a tool call, until max_iterations: two calls, the shell one first
    check_round(tmp_path, stub, "wharf.collect.agents.openhands:LocalOpenHands", "chat", 2, 0, 1.0,
                ['collect.agent_kwargs={"max_iterations": 2}'])


def check_round(tmp_path, stub, agent, api, n_calls, n_side, reward, more=()):
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HARBOR_TELEMETRY": "0"}
    cmd = ["make", "-s", "collect", "CONFIG=configs/agents-stub.yaml", f"collect.agent={agent}",
           f"endpoint.url={stub}", f"proxy.port={free_port()}", *more, f"ARGS=runs_dir={tmp_path}"]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    cdir = tmp_path / "agents-stub" / "rounds" / "0" / "collect"
    rollouts = schema.read_table(cdir / "rollouts.parquet", "rollouts").to_pylist()
    turns = schema.read_dir(cdir / "turns", "turns").to_pylist()
    assert len(rollouts) == 2 and [r["status"] for r in rollouts] == ["ok", "ok"]
    assert all(r["reward"] == reward and r["n_turns"] == n_calls for r in rollouts)  # the command ran in the sandbox
    for ro in rollouts:
        rows = sorted((t for t in turns if t["rollout_id"] == ro["rollout_id"]), key=lambda t: t["turn"])
        assert [t["api"] for t in rows] == [api] * n_calls and all(t["status"] == "ok" for t in rows)
        assert all(len(t["completion_token_ids"]) == len(t["completion_logprobs"]) > 0 for t in rows)
        assert json.loads(rows[0]["sampling"])["max_tokens"] <= 256  # sampling.max_tokens caps the agent's ask
        log = read_agent_log(cdir / ro["trial_dir"] / "agent")
        assert log is not None and compare(rows, log, ro["rollout_id"]) == []
        assert len(log.calls) == n_calls - n_side and len(log.side) == n_side
    manifest = json.loads((cdir / "manifest.json").read_text())
    assert manifest["counts"]["by_status"] == {"ok": 2}
    report = audit_round(cdir)  # the stub's ids are not a real tokenizer's: counts, answers, prompt sizes
    assert report.checked == 2 and report.ok, report.problems
