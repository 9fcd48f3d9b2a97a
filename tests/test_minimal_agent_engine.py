"""Real trials against the real local engine (SmolLM2-135M on the CPU): MinimalAgent, and harbor's
mini-swe-agent in text-based mode. The reward is whatever the model earns; what must hold is
that the run ends cleanly, every model call is in the trajectory, and the verifier graded it."""
from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "datasets" / "toy"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed"),
]


def trial_config(tmp_path: Path, agent: dict, name: str):
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig

    # The sandbox has no network but what it forwards: an agent inside (mini-swe-agent) reaches
    # the engine only through it; MinimalAgent calls from harbor's process.
    base_url = agent.get("kwargs", {}).get("base_url")

    return TrialConfig(
        task=TaskConfig(path=TOY / "sed-add"),
        trial_name=name,
        trials_dir=tmp_path / "trials",
        agent=AgentConfig(**agent),
        environment=EnvironmentConfig(
            import_path="wharf.collect.sandbox.bwrap:BwrapEnvironment",
            kwargs={"state_dir": str(tmp_path / "state"), **({"forward": [base_url]} if base_url else {})},
        ),
    )


def run_trial(cfg):
    from harbor.trial.trial import Trial

    async def go():
        return await (await Trial.create(cfg)).run()

    return asyncio.run(go())


def test_minimal_agent_against_the_engine(engine_url, tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")
    cfg = trial_config(
        tmp_path,
        {
            "import_path": "wharf.collect.agents.minimal:MinimalAgent",
            "model_name": "smollm2-135m",
            "kwargs": {"base_url": f"{engine_url}/v1", "api_key": "k", "max_turns": 2, "max_tokens": 64,
                       "temperature": 1.0},
        },
        "minimal",
    )
    result = run_trial(cfg)
    assert result.exception_info is None, result.exception_info
    rewards = result.verifier_result.rewards
    assert rewards["reward"] in (0.0, 1.0) and rewards["log_ok"] == 1
    traj = json.loads((tmp_path / "trials" / "minimal" / "agent" / "trajectory.json").read_text())
    assert 1 <= traj["n_calls"] == len(traj["calls"]) <= 2
    assert traj["stop_reason"] in ("done", "max_turns")
    for call in traj["calls"]:
        assert call["messages"][0]["role"] == "system" and isinstance(call["assistant"], str)
    assert result.agent_result.n_output_tokens > 0


def test_mini_swe_agent_textbased_against_the_engine(engine_url, tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")
    cfg = trial_config(
        tmp_path,
        {
            "import_path": "wharf.collect.agents.mini_swe:LocalMiniSweAgent",
            "model_name": "openai/smollm2-135m",
            "kwargs": {"base_url": f"{engine_url}/v1", "api_key": "k", "step_limit": 2, "max_tokens": 64},
        },
        "mini",
    )
    result = run_trial(cfg)
    # SmolLM2 rarely follows mini's format: a format or step-limit exit is a normal end, not a crash
    assert result.verifier_result is not None, result.exception_info
    assert result.verifier_result.rewards["log_ok"] == 1
    native = json.loads((tmp_path / "trials" / "mini" / "agent" / "mini-swe-agent.trajectory.json").read_text())
    # mini keeps no assistant message for a reply it rejects (format error, length), only its
    # complaint: so count what followed the system prompt and the task, 1-2 messages per call
    after_task = [m for m in native["messages"][2:] if m.get("role") in ("assistant", "user")]
    assert 1 <= len(after_task) <= 4, native["messages"]
    assert native["info"]["exit_status"] in ("LimitsExceeded", "Submitted", "FormatError", "RepeatedFormatError")
