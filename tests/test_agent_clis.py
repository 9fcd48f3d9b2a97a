"""The real claude-code and codex CLIs (pinned in wharf/collect/agents/node, `make agents`) against the
recording proxy, with the vLLM-shaped stub upstream scripted to call the agent's shell tool once
and then answer: default tools and flags, two model calls, every call a row with the upstream's own
token ids and log-probs, and the rows matching the agent's own log one for one.

A CLI that is not installed fails these tests (CliMissing names `make agents`); it never skips.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from testing.vllm_stub import StubServer
from wharf.collect.agents import node_clis
from wharf.collect.agents.claude_code import QUIET_ENV, anthropic_root
from wharf.collect.agents.codex import QUIET_CONFIG
from wharf.collect.agents.logs import AgentLog, _claude, _codex, compare
from proxy_util import close_rollout, open_rollout
from test_proxy_dialects import check_rows_match_upstream, proxy, rows  # noqa: F401 (proxy: a fixture, over this tap)
from test_proxy_engine import Tap

COMMAND = "echo wharf-was-here"


@pytest.fixture(scope="module")
def tap():
    with StubServer(script=f"shell:{COMMAND}", max_model_len=65536) as s:
        yield Tap(s.url).start()


def run_cli(argv: list[str], env: dict, cwd) -> subprocess.CompletedProcess:
    # A clean environment: only what the agent needs, HOME its own (no host config leaks in).
    base = {"PATH": node_clis.cli_env()["PATH"], "HOME": str(cwd / "home"), "LANG": "C.UTF-8"}
    (cwd / "home").mkdir(exist_ok=True)
    r = subprocess.run(argv, env={**base, **env}, cwd=cwd / "work", capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, f"{argv[0]} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def check_rows(proxy, tap, rid: str, api: str, log: AgentLog) -> list[dict]:
    assert close_rollout(proxy, rid) == {"rollout_id": rid, "n_turns": 2, "n_errors": 0, "published": True}
    got = rows(proxy)
    check_rows_match_upstream(got, tap.answers, api)  # ids, log-probs, finish: the upstream's own
    assert compare(got, log, rid) == []  # one row per call the agent logged, same answer, same prompt size
    assert len(log.calls) == 2 and all(len(r["completion_logprobs"]) == len(r["completion_token_ids"]) for r in got)
    return got


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "work").mkdir()
    return tmp_path


@pytest.mark.slow  # the real CLI, which `make agents` installs: not in make test-fast
def test_claude_code_two_turns_with_a_tool_call(proxy, tap, workdir):
    info = open_rollout(proxy, "claude")
    env = {**QUIET_ENV, "ANTHROPIC_BASE_URL": anthropic_root(info["base_url"]), "ANTHROPIC_API_KEY": info["api_key"],
           "CLAUDE_CONFIG_DIR": str(workdir / "claude-config")}
    r = run_cli([str(node_clis.cli("claude")), "-p", "Say hello from the shell.", "--output-format", "stream-json",
                 "--verbose", "--model", "policy-v3"], env, workdir)
    (workdir / "claude-code.txt").write_text(r.stdout)
    log = AgentLog("claude-code stream-json", _claude(workdir / "claude-code.txt"), False)
    got = check_rows(proxy, tap, "claude", "anthropic", log)
    first = json.loads(got[0]["request"])
    assert first["stream"] is True and first["max_tokens"] >= 1 and len(first["tools"]) > 5
    assert any(m["role"] == "system" for m in first["messages"])  # the mid-conversation system message
    use = [b for b in json.loads(got[0]["response"])["content"] if b["type"] == "tool_use"]
    assert use and use[0]["input"] == {"command": COMMAND}
    events = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    results = [b for e in events if e.get("type") == "user" for b in e["message"]["content"]
               if isinstance(b, dict) and b.get("type") == "tool_result"]
    assert "wharf-was-here" in json.dumps(results)  # the CLI really ran the command
    assert events[-1]["type"] == "result" and events[-1]["is_error"] is False


@pytest.mark.slow  # the real CLI, which `make agents` installs: not in make test-fast
def test_codex_two_turns_with_a_tool_call(proxy, tap, workdir):
    info = open_rollout(proxy, "codex")
    home = workdir / "codex-home"
    home.mkdir()
    config = "\n".join([
        'model = "policy-v3"', 'model_provider = "wharf"', 'approval_policy = "never"',
        *(f"{k} = {json.dumps(v)}" for k, v in QUIET_CONFIG.items() if not isinstance(v, dict)),
        "[analytics]", "enabled = false",
        "[model_providers.wharf]", 'name = "wharf"', f'base_url = "{info["base_url"]}"', 'wire_api = "responses"',
        'env_key = "OPENAI_API_KEY"', "request_max_retries = 0", "stream_max_retries = 0", ""])
    (home / "config.toml").write_text(config)
    r = run_cli([str(node_clis.cli("codex")), "exec", "--skip-git-repo-check", "--sandbox", "danger-full-access",
                 "--json", "Say hello from the shell."], {"CODEX_HOME": str(home), "OPENAI_API_KEY": info["api_key"]}, workdir)
    sessions = sorted((home / "sessions").rglob("rollout-*.jsonl"))
    log = AgentLog("codex session", _codex(sessions), False)
    got = check_rows(proxy, tap, "codex", "responses", log)
    first = json.loads(got[0]["request"])
    kinds = {t["type"] for t in first["tools"]}
    assert first["stream"] is True and "function" in kinds
    notes = json.loads(got[0]["sampling"]).get("wharf_notes") or {}
    hosted = [t["type"] for t in first["tools"] if t["type"] not in ("function", "namespace", "custom")]
    assert notes.get("dropped_tools", []) == hosted  # hosted tools (web_search) dropped, and counted in the row
    sent_names = {t["function"]["name"] for t in tap.answers[0][0]["tools"]}
    for t in first["tools"]:  # namespaced tools flattened to functions upstream
        if t["type"] == "namespace":
            assert {m["name"] for m in t["tools"]} <= {n.split(".")[-1] for n in sent_names}
    call = [it for it in json.loads(got[0]["response"])["output"] if it["type"] == "function_call"]
    assert call and json.loads(call[0]["arguments"]) in ({"cmd": COMMAND}, {"command": COMMAND})
    events = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    done = [e["item"] for e in events if e.get("type") == "item.completed"]
    assert any(i["type"] == "command_execution" and "wharf-was-here" in i.get("aggregated_output", "") for i in done)
    assert events[-1]["type"] == "turn.completed"


def test_a_missing_cli_fails_naming_make_agents(monkeypatch, tmp_path):
    monkeypatch.setattr(node_clis, "BIN_DIR", tmp_path)
    with pytest.raises(node_clis.CliMissing, match="make agents"):
        node_clis.cli("claude")


def test_a_missing_python_cli_fails_naming_make_agents_py(monkeypatch, tmp_path):
    from wharf.collect.agents import py_clis

    monkeypatch.setattr(py_clis, "BIN_DIR", tmp_path)
    with pytest.raises(node_clis.CliMissing, match=r"make agents-py.*aider-chat==0\.86\.2"):
        py_clis.cli("aider")
    env = py_clis.cli_env({"base_url": "http://h/rollout/r/v1", "api_key": "k"})
    assert env["PATH"].startswith(f"{tmp_path}:") and env["OPENAI_BASE_URL"] == env["OPENAI_API_BASE"] == "http://h/rollout/r/v1"
    assert env["OPENAI_API_KEY"] == "k"


def test_the_makefile_installs_the_python_clis_at_the_pins_the_classes_name():
    import re

    from wharf.collect.agents import py_clis
    from conftest import REPO

    line = re.search(r"^PY_AGENT_PINS := (.*)$", (REPO / "Makefile").read_text(), re.M).group(1)
    assert dict(p.split("=", 1) for p in line.split()) == py_clis.PINS


def test_openhands_is_harbors_with_its_venv_at_the_fixed_path(monkeypatch, tmp_path):
    from wharf.collect.agents import py_clis
    from wharf.collect.agents.openhands import LocalOpenHands

    agent = LocalOpenHands(logs_dir=tmp_path, model_name="openai/m", base_url="http://h/rollout/r/v1", api_key="k")
    assert agent.name() == "wharf-openhands"
    assert agent.get_version_command().startswith("/opt/openhands-venv/bin/python -m openhands.core.main")
    env = agent.model_connection.env
    assert (env["LLM_BASE_URL"], env["LLM_API_KEY"]) == ("http://h/rollout/r/v1", "k")
    monkeypatch.setattr(py_clis, "ROOT", tmp_path)
    with pytest.raises(node_clis.CliMissing, match=r"make agents-py.*openhands-ai==1\.6\.0"):
        agent.install_command()
