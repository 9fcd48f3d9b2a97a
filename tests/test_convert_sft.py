"""convert.mode=sft on real parquet: text-only calls rendered with the student's template give the
very prompt ids the local engine computes for the same request (its own request parsing, in
process), tools, system message and several turns included; a rollout's calls merge into one row
with the loss on the assistant's tokens only; GRPO refuses text-only rollouts by name."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from transformers import AutoTokenizer

from wharf.convert.reader import ConvertInputError
from wharf.convert.stage import convert_round
from wharf.core import schema
from wharf.core.batches import load_micro_batch, read_index
from wharf.core.config import load_config
from wharf.core.layout import CollectPaths
from wharf.core.model_store import embedded_model_dir, load_chat

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                           "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                          "required": ["command"]}}}]
SYSTEM = {"role": "system", "content": "You are a careful coding agent."}
USER = {"role": "user", "content": "How many lines does data.txt have?"}
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "wc -l data.txt"}'}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "42 data.txt"}
FINAL = {"role": "assistant", "content": "It has 42 lines."}


def conversation() -> list[tuple[list[dict], dict]]:
    """(request messages, answer) of each call of one agent run: a tool call, then the answer."""
    return [([SYSTEM, USER], CALL), ([SYSTEM, USER, CALL, RESULT], FINAL)]


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(embedded_model_dir()))


def engine_prompt_ids(tok, body: dict) -> list[int]:
    """The local engine's own prompt for a chat request: engine.chat_api.parse_chat on an engine
    core that holds only the tokenizer (no model, no server)."""
    from wharf.engine.chat_api import parse_chat
    from wharf.engine.core import EngineCore

    core = SimpleNamespace(tok=tok, cfg=SimpleNamespace(served_name="base"), max_model_len=8192,
                           default_temperature=1.0, default_top_p=1.0, adapter_for=lambda name: None,
                           style=load_chat(embedded_model_dir())[1])
    core.chat_prompt_ids = functools.partial(EngineCore.chat_prompt_ids, core)
    return parse_chat(core, body)[2]


def turn_row(rid: str, turn: int, messages: list[dict], answer: dict, **kw) -> dict:
    request = {"model": "teacher", "messages": messages, "tools": TOOLS}
    response = {"id": "x", "object": "chat.completion", "model": "teacher",
                "choices": [{"index": 0, "message": answer, "finish_reason": "tool_calls" if answer.get("tool_calls") else "stop"}]}
    return {"rollout_id": rid, "turn": turn, "request_id": f"{rid}-{turn}", "api": "chat", "policy": "teacher",
            "started_at": 1.7e9, "ended_at": 1.7e9 + 1, "request": json.dumps(request), "response": json.dumps(response),
            "sampling": json.dumps({"temperature": 0.7}), "prompt_token_ids": [], "completion_token_ids": [],
            "completion_logprobs": [], "finish_reason": response["choices"][0]["finish_reason"], "status": "ok",
            "error": None, "text_only": True, **kw}


def rollout_row(rid: str, reward: float, n_turns: int = 2) -> dict:
    return {"rollout_id": rid, "job_id": "teacher-job", "round": 0, "task_id": "count-lines", "group_id": "count-lines",
            "attempt": 0, "policy": "teacher", "reward": reward, "rewards": json.dumps({"reward": reward}),
            "status": "ok", "n_turns": n_turns, "started_at": 1.7e9, "ended_at": 1.7e9 + 9, "trial_dir": "", "error": None}


def write_job(d: Path, rewards: dict[str, float]) -> Path:
    paths = CollectPaths(d)
    turns = [turn_row(rid, i, m, a) for rid in rewards for i, (m, a) in enumerate(conversation())]
    schema.write_table(paths.turns / "part-00000.parquet", "turns", turns)
    schema.write_table(paths.rollouts, "rollouts", [rollout_row(rid, r) for rid, r in rewards.items()])
    return d


def test_convert_renders_exactly_the_engines_prompt_ids(tok):
    from wharf.convert.sft import render_chat_call

    for messages, answer in conversation():
        body = {"model": "base", "messages": messages, "tools": TOOLS}
        prompt, completion = render_chat_call(tok, body, {"choices": [{"message": answer}]})
        assert prompt == engine_prompt_ids(tok, body)
        assert completion[-1] == tok.convert_tokens_to_ids("<|im_end|>")  # the student stops where the turn ends
    # the system message and the tools are in the prompt, the answer's tool call in hermes markup
    first, call = render_chat_call(tok, {"messages": [SYSTEM, USER], "tools": TOOLS}, {"choices": [{"message": CALL}]})
    assert "careful coding agent" in tok.decode(first) and '"name": "bash"' in tok.decode(first)
    assert tok.decode(call).startswith("<tool_call>\n{\"name\": \"bash\"")
    # tool_choice none: the engine renders no tools, nor does convert
    body = {"model": "base", "messages": [USER], "tools": TOOLS, "tool_choice": "none"}
    assert render_chat_call(tok, body, {"choices": [{"message": FINAL}]})[0] == engine_prompt_ids(tok, body)
    with pytest.raises(ValueError, match="neither content nor tool_calls"):
        render_chat_call(tok, body, {"choices": [{"message": {"role": "assistant", "content": ""}}]})


def cfg(job: Path, out: Path, *extra):
    return load_config(None, [f"convert.jobs=[{job}]", f"convert.out_dir={out}", *extra])


def test_sft_rows_merge_a_rollouts_calls_and_mask_only_the_answers(tmp_path, tok):
    job = write_job(tmp_path / "job", {"good": 1.0, "bad": 0.0})
    stats = convert_round(cfg(job, tmp_path / "out", "convert.mode=sft"), progress=False)
    assert stats["rollouts"]["used"] == 1 and stats["rollouts"]["left_out"] == {"below_min_reward": 1}
    assert stats["sft"] == {"min_reward": 1.0, "rollouts": 1, "text_only_rollouts": 1}
    index = read_index(tmp_path / "out")
    assert [r["rollout_id"] for r in index.rollouts] == ["good"] and index.rollouts[0]["row_turns"] == [[0, 1]]
    (f,) = index.files
    mb = load_micro_batch(tmp_path / "out" / f.file)
    n = int(mb.attention_mask[0].sum())
    ids, mask = mb.input_ids[0, :n].tolist(), mb.completion_mask[0, :n].numpy()
    last_messages = conversation()[1][0]
    prompt = engine_prompt_ids(tok, {"messages": last_messages, "tools": TOOLS})
    final = tok.encode("It has 42 lines.<|im_end|>", add_special_tokens=False)
    assert ids == prompt + final  # one row: the last call's prompt (which holds the first call) + its answer
    spans = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    answers = [tok.decode(ids[a:b]) for a, b in zip(spans[::2], spans[1::2])]
    assert len(answers) == 2 and answers[1] == "It has 42 lines.<|im_end|>"
    assert answers[0].startswith("<tool_call>") and answers[0].endswith("</tool_call><|im_end|>")
    assert float(mb.advantages[0]) == 1.0 and float(mb.temperatures[0]) == 1.0 and not mb.old_logprobs.any()


def test_grpo_refuses_text_only_rollouts_by_name_and_writes_nothing(tmp_path):
    job = write_job(tmp_path / "job", {"r-1": 1.0, "r-0": 0.0})
    with pytest.raises(ConvertInputError, match=r"job: 2 rollouts are text-only \(r-0, r-1\).*convert.mode=sft"):
        convert_round(cfg(job, tmp_path / "out"), progress=False)
    assert not (tmp_path / "out").exists()


def rows_by_rollout(out: Path) -> dict[str, list[list[int]]]:
    index, got = read_index(out), {}
    for f in index.files:
        mb = load_micro_batch(out / f.file)
        for b in range(mb.shape[0]):
            n = int(mb.attention_mask[b].sum())
            got.setdefault(index.rollouts[int(mb.rollout_index[b])]["rollout_id"], []).append(mb.input_ids[b, :n].tolist())
    return {k: sorted(v) for k, v in got.items()}


def test_rollouts_with_token_ids_keep_them_untouched(tmp_path):
    from testing.synthetic_job import make_job

    job = tmp_path / "job"
    make_job(job, 12, seed=3, turns=(2, 4), size=0.05)
    convert_round(cfg(job, tmp_path / "g"), progress=False)
    grpo = rows_by_rollout(tmp_path / "g")
    convert_round(cfg(job, tmp_path / "s", "convert.mode=sft", "convert.sft.min_reward=0.5"), progress=False)
    sft = rows_by_rollout(tmp_path / "s")
    both = set(grpo) & set(sft)
    assert both and all(grpo[r] == sft[r] for r in both)
