"""Reading agents' own logs (collect/agents/logs.py) and the matrix's helpers, on small files laid
out as the agents write them (the real CLIs' logs are read in test_agent_clis/test_agent_rounds)."""
from __future__ import annotations

import json

from pipeline.agents_check import prompt_bytes, why
from collect.agents.logs import compare, read_agent_log


def row(turn, api, response, status="ok", n_prompt=3):
    return {"turn": turn, "api": api, "status": status, "response": json.dumps(response),
            "prompt_token_ids": list(range(n_prompt)), "request": "{}"}


def test_opencode_log_counts_every_stream_including_the_title_call(tmp_path):
    logs = tmp_path / "opencode" / "xdg-data" / "opencode" / "log"
    logs.mkdir(parents=True)
    (logs / "a.log").write_text("t=1 level=INFO message=stream modelID=gpt-5.4-nano small=true agent=title\n"
                                "t=2 level=INFO message=\"llm runtime selected\"\n"
                                "t=3 level=INFO message=stream modelID=p small=false agent=build\n")
    (tmp_path / "trajectory.json").write_text(json.dumps({"steps": [{"source": "agent", "metrics": {}}]}))
    log = read_agent_log(tmp_path)
    assert log.source == "opencode log" and len(log.calls) == 2 and not log.counts_errors
    ok = [row(0, "responses", {"id": "resp_a"}), row(1, "responses", {"id": "resp_b"})]
    assert compare(ok + [row(2, "responses", {}, status="error")], log, "r") == []  # a retried failure: not logged
    assert "2 ok turns rows but 1 model calls" in compare(ok, read_agent_log(_atif(tmp_path / "x")), "r")[0]


def _atif(d):
    d.mkdir()
    (d / "trajectory.json").write_text(json.dumps({"schema_version": "ATIF-v1", "steps": [
        {"source": "user", "message": "go"}, {"source": "agent", "message": "ok", "metrics": {"prompt_tokens": 3}}]}))
    return d


def test_claude_stream_json_groups_blocks_by_message_and_skips_synthetic(tmp_path):
    events = [{"type": "system", "subtype": "init"},
              {"type": "assistant", "message": {"id": "msg_1", "model": "p", "usage": {"input_tokens": 3},
                                                "content": [{"type": "text", "text": "a"}]}},
              {"type": "assistant", "message": {"id": "msg_1", "model": "p", "content": [{"type": "tool_use"}]}},
              {"type": "assistant", "message": {"id": "x", "model": "<synthetic>", "content": [{"type": "text", "text": "API Error"}]}}]
    (tmp_path / "claude-code.txt").write_text("noise on stderr\n" + "\n".join(json.dumps(e) for e in events))
    log = read_agent_log(tmp_path)
    assert [(c.text, c.response_ids, c.prompt_tokens) for c in log.calls] == [("a", {"msg_1"}, 3)]
    good = row(0, "anthropic", {"id": "msg_1", "content": [{"type": "text", "text": "a"}]})
    assert compare([good], log, "r") == []
    bad = row(0, "anthropic", {"id": "msg_2", "content": [{"type": "text", "text": "a"}]}, n_prompt=4)
    problems = compare([bad], log, "r")
    assert len(problems) == 2 and "msg_2" in problems[0] and "4 ids" in problems[1]


def test_prompt_bytes_per_api():
    a = {"api": "anthropic", "request": json.dumps({"system": [{"type": "text", "text": "abc"}], "tools": [1],
                                                     "messages": [{"role": "system", "content": "de"}]})}
    r = {"api": "responses", "request": json.dumps({"instructions": "a", "input": [
        {"role": "developer", "content": [{"type": "input_text", "text": "bc"}]}, {"role": "user", "content": "x"}]})}
    c = {"api": "chat", "request": json.dumps({"messages": [{"role": "system", "content": "abcd"}]})}
    assert prompt_bytes(a) == (5, 3) and prompt_bytes(r) == (3, 0) and prompt_bytes(c) == (4, 0)


def test_why_names_the_host_an_install_reaches_for(tmp_path):
    (tmp_path / "exception.txt").write_text('File "x", line 1, in install\n  curl: (6) Could not resolve host: '
                                            'example.invalid\nError: NVM failed to load\n')
    assert why(tmp_path, "NetworkConnectionError: ...") == "install downloads from example.invalid (no internet here)"
    (tmp_path / "exception.txt").write_text("in run\nRuntimeError: boom\nError: the agent gave up\n")
    assert why(tmp_path, "x") == "run: Error: the agent gave up"
    assert why(tmp_path, None) == ""
