"""The engine reads tool calls in the served model's format (wharf/engine/tool_parsers.py, picked
from wharf/core/families.py): tiny Llama 3 and Mistral models scripted to answer with a call in
their family's format (tests/tiny_families.py `scripted`) come back through the real openai
client with `tool_calls`, streamed or not, the raw markup kept in the token ids."""
from __future__ import annotations

import json

import pytest
import torch
from openai import OpenAI

from testing.app_thread import AppThread
from tests.tiny_families import scripted, start_engine
from wharf.core.config import EngineConfig
from wharf.engine.server import Engine, make_app

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
ASK = [{"role": "user", "content": "List the files."}]
# What each family's model is scripted to say, one token a piece (the markers are the families'
# special tokens), the parser the engine picks for it, and the content the call leaves.
CASES = {
    "llama3": (["<|python_tag|>", '{"name": "bash", "parameters": {"command": "ls -la"}}'], "llama3_json", None),
    "mistral": (["Let me look.", "[TOOL_CALLS]", ' [{"name": "bash", "arguments": {"command": "ls -la"}}]'],
                "mistral", "Let me look."),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def served(request, tmp_path_factory):
    """(family, model dir, openai client, the engine's log lines) for a scripted model."""
    torch.set_num_threads(2)
    name = request.param
    model_dir = scripted(name, tmp_path_factory.mktemp(name) / "model", ASK, TOOLS, CASES[name][0])
    engine, lines = start_engine(model_dir)
    with AppThread(lambda: make_app(engine), name=f"engine-{name}") as app:
        yield name, model_dir, OpenAI(base_url=f"{app.url}/v1", api_key="EMPTY", max_retries=0), lines.lines


def ask(client: OpenAI, stream: bool, **kw) -> dict:
    """One greedy chat call, a stream folded into the shape of a whole answer."""
    body = dict(model="m", messages=ASK, max_tokens=8, temperature=0.0, logprobs=True,
                extra_body={"return_token_ids": True}, **kw)
    if not stream:
        c = client.chat.completions.create(**body).choices[0]
        return {"content": c.message.content, "calls": c.message.tool_calls or [], "finish": c.finish_reason,
                "ids": c.model_extra["token_ids"], "deltas": []}
    out = {"content": "", "calls": [], "finish": None, "ids": [], "deltas": []}
    for chunk in client.chat.completions.create(stream=True, **body):
        c = chunk.choices[0]
        out["deltas"].append(c.delta.content or "")
        out["content"] += c.delta.content or ""
        out["calls"] += c.delta.tool_calls or []
        out["ids"] += c.model_extra["token_ids"]
        out["finish"] = c.finish_reason or out["finish"]
    return out


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_in_the_familys_format_comes_back_as_tool_calls(served, stream):
    name, model_dir, client, lines = served
    pieces, parser, content = CASES[name]
    r = ask(client, stream, tools=TOOLS)
    assert r["finish"] == "tool_calls", r
    [call] = r["calls"]
    assert call.type == "function" and call.function.name == "bash"
    assert json.loads(call.function.arguments) == {"command": "ls -la"}
    if name == "mistral":  # Mistral's templates take only 9-letter-or-digit call ids, as vLLM makes them
        assert len(call.id) == 9 and call.id.isalnum()
    # A stream shows the text before the call and nothing of the call itself.
    assert r["content"] == (content or "" if stream else content)
    assert not any("{" in d or "[TOOL" in d for d in r["deltas"])
    from transformers import AutoTokenizer

    # the ids keep the markup: the scripted pieces, then the end-of-turn token
    assert AutoTokenizer.from_pretrained(model_dir).decode(r["ids"][:-1]) == "".join(pieces)
    assert any(f"engine: tool calls read as {parser} (the family's format" in line for line in lines), lines


def test_without_tools_the_same_answer_is_text(served):
    name, _, client, _ = served
    r = ask(client, False)
    assert r["finish"] == "stop" and not r["calls"]
    assert '"bash"' in r["content"]  # the special-token markers are skipped, the JSON is plain text


def test_engine_tool_parser_overrides_the_familys_format(served):
    name, model_dir, _, _ = served
    engine = Engine(EngineConfig(model=str(model_dir), served_name="m", device="cpu", threads=2, tool_parser="hermes"))
    with AppThread(lambda: make_app(engine), name=f"engine-{name}-hermes") as app:
        r = ask(OpenAI(base_url=f"{app.url}/v1", api_key="EMPTY", max_retries=0), False, tools=TOOLS)
    assert engine.core.tool_parser.name == "hermes"
    assert r["finish"] == "stop" and not r["calls"]  # no hermes block in the answer: it stays text
    assert '{"name": "bash"' in r["content"]
