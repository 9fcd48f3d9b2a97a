"""convert.mode=sft: demonstrations -> supervised rows in the same micro-batch files.

Which rollouts: those with reward >= convert.sft.min_reward (infra failures and rollouts without
calls are left out as in grpo mode). Their rows are built exactly as GRPO rows are (rows.py: a
rollout's calls merged where each prompt extends the previous row, split where not; loss mask on
the generated tokens only), with advantage 1, behaviour log-probs 0 (train.objective=sft reads
neither) and temperature 1: the NLL is that of the model's own distribution, on which the
sampling temperature acts later.

A call recorded with token ids keeps them untouched. A text-only call (a teacher without ids, an
imported trajectory) is rendered here with the STUDENT's tokenizer and chat template through
wharf.chat_template, the function the local engine prompts with, so the row's prompt ids are the
ones the student will see, and the answer is what the student would generate to say it.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Callable

from wharf.convert.build import Built, _candidates, _count_rules, _stats
from wharf.convert.reader import Job
from wharf.convert.rows import RowOptions
from wharf.core.chat_template import PLAIN, ChatError, ChatStyle, render_answer_ids, render_prompt_ids
from wharf.core.model_store import load_chat

SFT_TEMPERATURE = 1.0
_ANSWER_KEYS = ("role", "content", "tool_calls")


def render_chat_call(tok, request: dict, response: dict, style: ChatStyle = PLAIN) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids) of one chat call: its request as the engine renders it, then
    its answer as the student would generate it. ValueError names the field that is wrong."""
    messages, tools = request.get("messages"), request.get("tools") or None
    if request.get("tool_choice") == "none":  # the engine (and vLLM) then render no tools
        tools = None
    choices = response.get("choices") if isinstance(response, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0].get("message"), dict):
        raise ValueError("response.choices[0].message: missing (no answer to learn from)")
    msg = choices[0]["message"]
    answer = {k: msg[k] for k in _ANSWER_KEYS if msg.get(k) is not None}
    answer["role"] = "assistant"
    if not answer.get("content") and not answer.get("tool_calls"):
        raise ValueError("response.choices[0].message: neither content nor tool_calls")
    kwargs = request.get("chat_template_kwargs")
    try:
        prompt = render_prompt_ids(tok, messages, tools, chat_template_kwargs=kwargs, style=style)
        completion = render_answer_ids(tok, messages, tools, answer, chat_template_kwargs=kwargs, style=style)
    except ChatError as e:
        raise ValueError(f"request.{e}") from None
    return prompt, completion


def chat_renderer(model_dir: Path) -> Callable:
    """render(api, request JSON, response JSON) for reader.read_job, with the student's tokenizer."""
    tok, style = load_chat(model_dir)

    def render(api: str, request: str | None, response: str | None) -> tuple[list[int], list[int]]:
        if api != "chat":
            raise ValueError(f"api {api!r}: only chat calls are rendered (record the teacher through the chat API)")
        try:
            req, resp = json.loads(request or "null"), json.loads(response or "null")
        except ValueError as e:
            raise ValueError(f"request/response: not JSON ({e})") from None
        if not isinstance(req, dict):
            raise ValueError("request: not a JSON object")
        return render_chat_call(tok, req, resp, style)

    return render


def build_sft(jobs: list[Job], opts: RowOptions, min_reward: float, null_reward: float | None,
              skip_bad: bool = False) -> Built:
    rstats, breaks, agents, rules = Counter(), {}, {}, {}
    job_left = {j.job_id: Counter() for j in jobs}
    cands = [c for job in jobs
             for c in _candidates(job, opts, null_reward, job_left[job.job_id], rstats, breaks, agents, skip_bad)]
    out = Built()
    for c in sorted(cands, key=lambda c: (c.group, c.rollout["rollout_id"])):
        left = job_left[c.job.job_id]
        if c.reward < min_reward:
            left["below_min_reward"] += 1
            continue
        if c.rollout["status"] == "context_exceeded" and opts.context_exceeded == "mask":
            left["context_exceeded_masked"] += 1
            continue
        _count_rules(rules, c.built)
        if not c.rows:
            left["no_rows"] += 1
            continue
        if c.group not in out.groups:
            out.groups.append(c.group)
        ri = len(out.rollouts)
        out.rollouts.append({"rollout_id": c.rollout["rollout_id"], "job": c.job.job_id, "dir": str(c.job.dir),
                             "group_id": c.group, "task_id": c.rollout["task_id"], "status": c.rollout["status"],
                             "policy": c.rollout.get("policy"), "reward": c.reward, "advantage": 1.0,
                             "rows": len(c.rows), "row_turns": [r.turns for r in c.rows],
                             "text_only": c.rollout["rollout_id"] in c.job.text_only})
        tokens = sum(row.trainable for row in c.rows)
        for row in c.rows:
            row.temperature = SFT_TEMPERATURE
            out.rows.append(row)
            out.advantages.append(1.0)
            out.weights.append(row.trainable / tokens)
            out.rollout_index.append(ri)
            out.group_index.append(out.groups.index(c.group))
    out.stats = _stats(jobs, out, job_left, rstats, breaks, agents, len(out.groups), Counter())
    out.stats["rules"] = {k: dict(v) for k, v in sorted(rules.items())}
    out.stats["sft"] = {"min_reward": min_reward, "rollouts": len(out.rollouts),
                        "text_only_rollouts": sum(r["text_only"] for r in out.rollouts)}
    return out
