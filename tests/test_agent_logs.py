"""Reading agents' own logs (wharf/collect/agents/logs.py) and the matrix's helpers, on small files laid
out as the agents write them (the real CLIs' logs are read in test_agent_clis/test_agent_rounds)."""
from __future__ import annotations

import json
import sqlite3

import numpy as np

from wharf.pipeline.agents_check import converts, prompt_bytes, why
from wharf.collect.agents.logs import compare, read_agent_log
from wharf.collect.agents.opencode_db import title_of
from testing.stub_template import render_prompt
from testing.vllm_stub import Stub
from wharf.convert.rows import Call


def row(turn, api, response, status="ok", n_prompt=3):
    return {"turn": turn, "api": api, "status": status, "response": json.dumps(response),
            "prompt_token_ids": list(range(n_prompt)), "request": "{}"}


def _opencode_db(agent_dir, title, calls):
    """opencode.db laid out as opencode 1.18 writes it (the columns read), left in WAL mode with the
    writer still open, as a killed or just-exited CLI leaves it. calls: (item ids, text, prompt tokens)."""
    d = agent_dir / "opencode" / "xdg-data" / "opencode"
    d.mkdir(parents=True)
    db = sqlite3.connect(d / "opencode.db")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE session (id TEXT, title TEXT, time_created INTEGER)")
    db.execute("CREATE TABLE message (id TEXT, session_id TEXT, time_created INTEGER, data TEXT)")
    db.execute("CREATE TABLE part (id TEXT, message_id TEXT, session_id TEXT, time_created INTEGER, data TEXT)")
    db.execute("INSERT INTO session VALUES ('s', ?, 1)", (title,))
    db.execute("INSERT INTO message VALUES ('m0', 's', 1, ?)", (json.dumps({"role": "user"}),))
    for n, (items, text, prompt) in enumerate(calls, start=1):
        db.execute("INSERT INTO message VALUES (?, 's', ?, ?)", (f"m{n}", n + 1, json.dumps({"role": "assistant"})))
        parts = [{"type": "step-start"}, *({"type": "tool", "metadata": {"openai": {"itemId": i}}} for i in items),
                 {"type": "step-finish", "tokens": {"input": prompt - 1, "cache": {"read": 1}}}]
        if text:
            parts.insert(1, {"type": "text", "text": text, "metadata": {"openai": {"itemId": f"msg_t{n}_0"}}})
        for k, p in enumerate(parts):
            db.execute("INSERT INTO part VALUES (?, ?, 's', ?, ?)", (f"p{n}{k}", f"m{n}", 10 * n + k, json.dumps(p)))
    db.commit()
    return db


def test_opencode_session_db_holds_every_call_and_the_title_side_call(tmp_path):
    writer = _opencode_db(tmp_path, "Say hi", [(["fc_a_0"], "", 5), ([], "done", 7)])
    assert (tmp_path / "opencode" / "xdg-data" / "opencode" / "opencode.db-wal").stat().st_size > 0
    log = read_agent_log(tmp_path)
    assert log.source == "opencode session database" and not log.counts_errors
    assert [(c.response_ids, c.text, c.prompt_tokens) for c in log.calls] == [({"resp_a"}, "", 5), ({"resp_t2"}, "done", 7)]
    a = row(0, "responses", {"id": "resp_a", "output": []}, n_prompt=5)
    b = row(2, "responses", {"id": "resp_t2", "output": [
        {"type": "message", "content": [{"type": "output_text", "text": "done"}]}]}, n_prompt=7)
    title = row(1, "responses", {"id": "resp_x", "output": [
        {"type": "message", "content": [{"type": "output_text", "text": "<think>hm</think>\n\n  Say hi \nmore"}]}]})
    assert compare([a, title, b], log, "r") == []  # the title call in the middle: matched by what it answered
    assert compare([a, b], log, "r") == ["r: 2 ok turns rows (0 beside the conversation) but 3 model calls "
                                         "(1 beside it) in the agent's opencode session database"]
    other = dict(title, response=json.dumps({"id": "resp_x", "output": []}))
    assert compare([a, other, b], log, "r") == ["r turn 1: recorded response differs from the agent's text"]
    writer.close()


def test_opencode_untitled_session_made_no_side_call_and_long_titles_are_cut(tmp_path):
    writer = _opencode_db(tmp_path, "New session - 2026-11-24T14:31:04.288Z", [([], "ok", 3)])
    log = read_agent_log(tmp_path)
    assert len(log.calls) == 1 and log.side == []
    writer.close()
    assert title_of("x" * 101) == "x" * 97 + "..." and title_of("y" * 100) == "y" * 100
    assert title_of("\n \n") == "" and title_of("<think>a\nb</think> t1\nt2") == "t1"


def test_qwen_chat_recording_one_assistant_record_per_call(tmp_path):
    chats = tmp_path / "qwen-sessions" / "-app" / "chats"
    chats.mkdir(parents=True)
    events = [{"type": "user", "message": {"role": "user", "parts": [{"text": "go"}]}},
              {"type": "system", "subtype": "ui_telemetry"},
              {"type": "assistant", "message": {"role": "model", "parts": [{"functionCall": {"name": "sh"}}]},
               "usageMetadata": {"promptTokenCount": 3}},
              {"type": "assistant", "message": {"role": "model", "parts": [{"text": "thinking", "thought": True},
                                                                           {"text": "do"}, {"text": "ne"}]},
               "usageMetadata": {"promptTokenCount": 4}}]
    (chats / "s.jsonl").write_text("\n".join(json.dumps(e) for e in events))
    log = read_agent_log(tmp_path)
    assert log.source == "qwen-code chat recording"
    assert [(c.text, c.prompt_tokens) for c in log.calls] == [("", 3), ("done", 4)]
    done = row(1, "chat", {"id": "c2", "choices": [{"message": {"content": "done"}}]}, n_prompt=4)
    assert compare([row(0, "chat", {"id": "c1", "choices": [{"message": {}}]}), done], log, "r") == []


def test_atif_counts_agent_steps_with_metrics(tmp_path):
    log = read_agent_log(_atif(tmp_path / "x"))
    assert log.source == "ATIF trajectory" and [c.prompt_tokens for c in log.calls] == [3]
    ok = [row(0, "chat", {"id": "a"}), row(1, "chat", {"id": "b"})]
    assert compare(ok, log, "r") == ["r: 2 ok turns rows but 1 model calls in the agent's ATIF trajectory"]


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


def _call(turn, prompt, completion):
    return Call(turn, np.array(prompt, np.int32), np.array(completion, np.int32), np.zeros(len(completion), np.float32))


def test_converts_counts_training_rows_and_prefix_breaks():
    a, b = _call(0, [1, 2], [3]), _call(1, [1, 2, 3, 4], [5])  # b's prompt extends a's prompt + answer
    assert converts([a, b]) == "2 -> 1 row, 0 breaks"
    side = _call(2, [9, 9], [1])  # another conversation (opencode's title call)
    assert converts([a, side, b]) == "3 -> 3 rows, 2 breaks"
    assert converts([a, b, side]) == "3 -> 2 rows, 1 break"
    assert converts([a, b, _call(3, [1, 2, 3, 4], [5])]) == "2 -> 1 row, 0 breaks"  # a retried duplicate
    cut = [Call(c.turn, c.prompt, c.completion, c.logprobs, finish_reason="length") for c in (a, b)]
    assert converts(cut) == "2 -> 1 row, 0 breaks"  # both cut at max_tokens: convert masks them, the row is there


def test_stub_renders_a_tool_call_back_token_for_token():
    """The stub's template renders the tool call it wrote as it wrote it, even re-serialized by the
    agent (vLLM parses arguments before templating): the next prompt extends prompt + completion."""
    stub = Stub(script="shell:echo hi")
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}}}}]
    msgs = [{"role": "user", "content": "go"}]
    prompt = render_prompt(msgs, tools)
    gen = stub.generate({"messages": msgs, "tools": tools, "seed": 0}, prompt)
    assert gen["tool_call"]["function"]["arguments"] == '{"command": "echo hi"}'
    back = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "bash", "arguments": '{"command":"echo hi"}'}}]}
    nxt = render_prompt(msgs + [back, {"role": "tool", "tool_call_id": "c", "content": "hi"}], tools)
    assert nxt[:len(prompt) + len(gen["ids"])] == prompt + gen["ids"]


def test_aider_llm_history_one_response_block_per_call(tmp_path):
    (tmp_path / "aider.llm.history.txt").write_text(
        "TO LLM 2026-11-24T14:41:53\n-------\nSYSTEM Act as an expert.\nUSER Create hello.txt\n"
        "LLM RESPONSE 2026-11-24T14:41:54\nASSISTANT hello.txt\nASSISTANT \nASSISTANT ```\n"
        "TO LLM 2026-11-24T14:41:55\nUSER LLM RESPONSE is just text here\n"
        "LLM RESPONSE 2026-11-24T14:41:56\n")
    (tmp_path / "trajectory.json").write_text("{}")  # its own log wins over a generic one
    log = read_agent_log(tmp_path)
    assert log.source == "aider LLM history" and [c.text for c in log.calls] == ["hello.txt\n\n```", ""]
    first = row(0, "chat", {"id": "a", "choices": [{"message": {"content": "hello.txt\n\n```\n"}}]})
    empty = row(1, "chat", {"id": "b", "choices": [{"message": {"content": ""}}]})
    assert compare([first, empty], log, "r") == []  # the answer's last newline is not in aider's log
    changed = row(0, "chat", {"id": "a", "choices": [{"message": {"content": "hello.txt\n```"}}]})
    assert compare([changed, empty], log, "r") == ["r turn 0: recorded response differs from the agent's text"]


def test_vibe_journal_one_completion_action_per_call(tmp_path):
    journal = tmp_path / "vibe-home" / "logs" / "session" / "unified" / "s1" / "journal"
    journal.mkdir(parents=True)
    result = {"finish_reason": "stop", "parts": [{"type": "text", "text": "Do"}, {"type": "text", "text": "ne"}],
              "usage": {"input_tokens": 7}}
    records = [{"payload": {"method": "turn/start"}},
               {"payload": {"action_id": "a1", "kind": "completion", "request": {}}},
               {"payload": {"action_id": "a1", "result": {"result": {"parts": [{"type": "tool_call"}],
                                                                      "usage": {"input_tokens": 5}}}}},
               {"payload": {"action_id": "t1", "kind": "tool", "request": {}}},
               {"payload": {"action_id": "t1", "result": {"result": {"content": []}}}},
               {"payload": {"input": {"command": {"action_id": "a1", "result": {"parts": []}}}}},
               {"payload": {"action_id": "a2", "kind": "completion", "request": {}}}]
    (journal / "0000000000000001.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    (journal / "0000000000000022.jsonl").write_text(json.dumps({"payload": {"action_id": "a2", "result": {"result": result}}}))
    log = read_agent_log(tmp_path)
    assert log.source == "vibe session journal"
    assert [(c.text, c.prompt_tokens) for c in log.calls] == [("", 5), ("Done", 7)]


def test_openhands_completions_log_one_file_per_call_in_time_order(tmp_path):
    done = tmp_path / "completions"
    done.mkdir()
    calls = [(12.5, {"id": "b", "choices": [{"message": {"content": "Done"}}], "usage": {"prompt_tokens": 9}}),
             (3.25, {"id": "a", "choices": [{"message": {"content": None, "tool_calls": [{"id": "t"}]}}],
                     "usage": {"prompt_tokens": 5}})]
    for t, resp in calls:  # named <model>-<time>.json by OpenHands: the later call's name sorts first here
        (done / f"openai__m-{t}.json").write_text(json.dumps({"messages": [], "response": resp, "args": [],
                                                               "kwargs": {}, "timestamp": t, "cost": 0.0}))
    (tmp_path / "trajectory.json").write_text(json.dumps({"steps": []}))  # harbor's ATIF: not read
    log = read_agent_log(tmp_path)
    assert log.source == "openhands completions log" and not log.counts_errors
    assert [(c.text, c.response_ids, c.prompt_tokens) for c in log.calls] == [("", {"a"}, 5), ("Done", {"b"}, 9)]
    rows = [row(0, "chat", {"id": "a", "choices": [{"message": {"content": None}}]}, n_prompt=5),
            row(1, "chat", {"id": "b", "choices": [{"message": {"content": "Done"}}]}, n_prompt=9)]
    assert compare(rows, log, "r") == []
    rows[1]["response"] = json.dumps({"id": "c", "choices": [{"message": {"content": "Done"}}]})
    assert compare(rows, log, "r") == ["r turn 1: the agent logged answer ['b'], the row holds c"]
