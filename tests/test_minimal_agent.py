"""MinimalAgent: command extraction, and real harbor trials in the bwrap sandbox against a real
HTTP server that answers scripted chat completions in the OpenAI wire format (the model's
answers are scripted so the agent's loop is checked exactly; tests/test_minimal_agent_engine.py
runs it against the real engine)."""
from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import pytest
from aiohttp import web

from wharf.collect.agents.minimal import MinimalAgent, extract_command, is_done
from wharf.collect.importers import import_trajectories
from wharf.core import schema
from wharf.core.layout import CollectPaths

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "datasets" / "toy"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


@pytest.mark.parametrize(
    "text, command",
    [
        ("```bash\nsed -i 's/a - b/a + b/' calc.py\n```", "sed -i 's/a - b/a + b/' calc.py"),
        ("Sure:\n```sh\necho hi > a.txt\n```\nThen DONE", "echo hi > a.txt"),
        ("```\nls\n```", "ls"),
        ("```mswea_bash_command\ncat x.py\n```", "cat x.py"),
        ("```bash\n$ echo 42 > answer.txt\n```", "echo 42 > answer.txt"),
        ("```bash\necho 1 > a\necho 2 > b", "echo 1 > a\necho 2 > b"),  # unclosed: cut off by max_tokens
        ("I will run it.\n$ echo hello > hello.txt\nok", "echo hello > hello.txt"),
        ("To fix it:\n sed -i 's/Helo/Hello/' greet.py", "sed -i 's/Helo/Hello/' greet.py"),
        ("`echo 42 > answer.txt`", "echo 42 > answer.txt"),
        ("The function should add the numbers.", None),
        ("DONE", None),
        ("```bash\n\n```", None),
    ],
)
def test_extract_command(text, command):
    assert extract_command(text) == command


def test_done_marker():
    assert is_done("DONE") and is_done("The task is DONE.") and is_done("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
    assert not is_done("done") and not is_done("UNDONE")


def test_unknown_kwarg_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="max_turn"):
        MinimalAgent(logs_dir=tmp_path, model_name="m", max_turn=3)


class ScriptedEndpoint:
    """A real aiohttp server speaking OpenAI chat completions; answers come from a script,
    an int in the script answers that HTTP error status instead."""

    def __init__(self, script: list):
        self.script = list(script)
        self.requests: list[dict] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        item = self.script.pop(0) if self.script else "DONE"
        if isinstance(item, int):
            return web.json_response({"error": {"message": "scripted failure", "type": "server_error"}}, status=item)
        return web.json_response({
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": item}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
        })

    async def __aenter__(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def __aexit__(self, *exc):
        await self.runner.cleanup()


def imported_calls(collect_dir: Path) -> list[tuple[list[dict], str]]:
    """(request messages, answer) of each turns row `wharf import` wrote, in order."""
    rows = sorted(schema.read_dir(CollectPaths(collect_dir).turns, "turns").to_pylist(), key=lambda t: t["turn"])
    return [(json.loads(t["request"])["messages"], json.loads(t["response"])["choices"][0]["message"]["content"])
            for t in rows]


async def run_trial(task: str, tmp_path: Path, base_url: str, **kwargs):
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    cfg = TrialConfig(
        task=TaskConfig(path=TOY / task),
        trial_name=f"{task}__minimal",
        trials_dir=tmp_path / "trials",
        agent=AgentConfig(
            import_path="wharf.collect.agents.minimal:MinimalAgent",
            model_name="smollm2-135m",
            kwargs={"base_url": base_url, "api_key": "k", **kwargs},
        ),
        environment=EnvironmentConfig(
            import_path="wharf.collect.sandbox.bwrap:BwrapEnvironment"
        ),
    )
    result = await (await Trial.create(cfg)).run()
    trajectory = json.loads((tmp_path / "trials" / cfg.trial_name / "agent" / "trajectory.json").read_text())
    return result, trajectory


@pytest.mark.slow  # a real harbor trial in the sandbox: not in make test-fast
@needs_bwrap
def test_trial_solves_task_and_records_every_call(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")
    script = [
        "I will look first.\n```bash\ncat calc.py\n```",
        "no command here",
        "Sure!\n```\nsed -i 's/a - b/a + b/' calc.py\n```",
        "DONE",
    ]

    async def go():
        server = ScriptedEndpoint(script)
        async with server as url:
            result, traj = await run_trial("sed-add", tmp_path, url, max_turns=6, max_tokens=64)
        return server, result, traj

    server, result, traj = asyncio.run(go())
    assert result.exception_info is None, result.exception_info
    assert result.verifier_result.rewards["reward"] == 1.0
    # one trajectory entry per model call, in order, with exactly what went over the wire
    assert traj["n_calls"] == len(traj["calls"]) == len(server.requests) == 4
    assert traj["stop_reason"] == "done"
    for call, sent, answer in zip(traj["calls"], server.requests, script):
        assert call["messages"] == sent["messages"]
        assert call["assistant"] == answer
        assert sent["model"] == "smollm2-135m" and sent["max_tokens"] == 64
        assert "temperature" not in sent  # the proxy forces it
    # each call's prompt is the previous prompt + answer + observation: the prefix never breaks
    for prev, nxt in zip(server.requests, server.requests[1:]):
        assert nxt["messages"][: len(prev["messages"])] == prev["messages"]
    assert "return a - b" in traj["calls"][0]["observation"]
    assert "No command found" in server.requests[2]["messages"][-1]["content"]
    assert traj["calls"][2]["command"] == "sed -i 's/a - b/a + b/' calc.py" and traj["calls"][2]["exit_code"] == 0
    assert result.agent_result.n_input_tokens == 400 and result.agent_result.n_output_tokens == 40
    # `wharf import` reads the trial as the model saw it: every call's messages and answer, the verifier's reward
    m = import_trajectories([tmp_path / "trials"], tmp_path / "imported")
    assert (m["formats"], m["agent"], m["tasks"], m["mean_reward"]) == (["minimal"], "wharf-minimal", ["sed-add"], 1.0)
    assert imported_calls(tmp_path / "imported") == [(r["messages"], a) for r, a in zip(server.requests, script)]


@pytest.mark.slow  # a real harbor trial in the sandbox: not in make test-fast
@needs_bwrap
def test_turn_limit_ends_the_run_and_it_is_graded(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")

    async def go():
        server = ScriptedEndpoint(["```bash\necho hi\n```"] * 5)
        async with server as url:
            return server, *(await run_trial("write-hello", tmp_path, url, max_turns=2))

    server, result, traj = asyncio.run(go())
    assert result.exception_info is None
    assert len(server.requests) == traj["n_calls"] == 2 and traj["stop_reason"] == "max_turns"
    assert result.verifier_result.rewards["reward"] == 0.0


@pytest.mark.slow  # a real harbor trial in the sandbox: not in make test-fast
@needs_bwrap
def test_endpoint_error_is_an_agent_error_not_a_success(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")

    async def go():
        server = ScriptedEndpoint(["```bash\nls\n```", 500])
        async with server as url:
            return server, *(await run_trial("sed-add", tmp_path, url))

    server, result, traj = asyncio.run(go())
    assert len(server.requests) == 2, "no client retry: every request is one recorded call"
    assert result.exception_info is not None
    assert "model call 1" in result.exception_info.exception_message
    # imported, the call the endpoint failed is left out: no answer to learn from
    import_trajectories([tmp_path / "trials"], tmp_path / "imp", reward=0.0)
    assert imported_calls(tmp_path / "imp") == [(server.requests[0]["messages"], "```bash\nls\n```")]
    assert traj["stop_reason"] == "endpoint_error" and "error" in traj["calls"][1]
    assert traj["calls"][0]["assistant"] == "```bash\nls\n```"


@pytest.mark.slow  # a real harbor trial in the sandbox: not in make test-fast
@needs_bwrap
def test_mini_swe_agent_runs_offline_from_the_venv(tmp_path, monkeypatch):
    """harbor's mini-swe-agent with our offline install: the real `mini-swe-agent` CLI and litellm
    in the sandbox, text-based mode, against the scripted endpoint."""
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    monkeypatch.setenv("HARBOR_TELEMETRY", "0")
    script = [
        "THOUGHT: fix it.\n```mswea_bash_command\nsed -i 's/a - b/a + b/' calc.py\n```",
        "```mswea_bash_command\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```",
    ]

    async def go():
        server = ScriptedEndpoint(script)
        async with server as url:
            cfg = TrialConfig(
                task=TaskConfig(path=TOY / "sed-add"),
                trial_name="mini",
                trials_dir=tmp_path / "trials",
                agent=AgentConfig(
                    import_path="wharf.collect.agents.mini_swe:LocalMiniSweAgent",
                    model_name="openai/smollm2-135m",
                    kwargs={"base_url": url, "api_key": "k", "step_limit": 4, "max_tokens": 64},
                ),
                environment=EnvironmentConfig(  # the endpoint is the sandbox's one way out
                    import_path="wharf.collect.sandbox.bwrap:BwrapEnvironment", kwargs={"forward": [url]}
                ),
            )
            return server, await (await Trial.create(cfg)).run()

    server, result = asyncio.run(go())
    assert result.exception_info is None, result.exception_info
    assert result.verifier_result.rewards["reward"] == 1.0
    assert len(server.requests) == 2
    first = server.requests[0]
    assert first["model"] == "smollm2-135m" and first["max_tokens"] == 64 and "tools" not in first
    assert "mswea_bash_command" in first["messages"][0]["content"]  # the text-based prompt
    native = json.loads((tmp_path / "trials" / "mini" / "agent" / "mini-swe-agent.trajectory.json").read_text())
    assert [m["content"] for m in native["messages"] if m["role"] == "assistant"] == script
