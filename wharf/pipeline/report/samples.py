"""Sample trajectories for the report: in a few groups of the latest round, the best and the worst
rollout, each model call's new messages and answer, read from the round's rollouts and turns.

Picking and parsing are pure; `read_samples` is the I/O. Chat, Anthropic Messages and OpenAI
Responses requests are read alike: the messages (or input items) and the answer as text.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from wharf.core import schema
from wharf.core.layout import RoundLayout

log = logging.getLogger("wharf.report")

MAX_CHARS = 1500  # of one message on the page: the rest is said as a count


@dataclass(frozen=True)
class Message:
    role: str
    text: str


@dataclass(frozen=True)
class Call:
    turn: int
    new: list[Message]  # the request's messages this call added (all of them for the first call)
    answer: Message
    resent: bool = False  # the request did not extend the previous one: its whole history is shown
    finish_reason: str | None = None
    status: str | None = None


@dataclass(frozen=True)
class Sample:
    which: str  # best | worst
    rollout: dict  # its rollouts row: rollout_id, task_id, group_id, attempt, reward, status, n_turns, n_errors
    group_rewards: list[float | None]
    calls: list[Call] = field(default_factory=list)


def pick(rows: list[dict], groups: int = 2) -> list[tuple[str, dict, list]]:
    """(best|worst, rollout, its group's rewards) for up to `groups` groups, those with different
    rewards first (where GRPO learns), then by name; a group of one rollout gives only its best."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["group_id"], []).append(r)
    score = lambda r: -1.0 if r["reward"] is None else r["reward"]  # noqa: E731  no reward: worst
    ranked = sorted(by.items(), key=lambda kv: (len({score(r) for r in kv[1]}) < 2, kv[0]))
    out = []
    for _, members in ranked[:groups]:
        members = sorted(members, key=lambda r: (-score(r), r.get("attempt") or 0))
        rewards = [r["reward"] for r in members]
        out.append(("best", members[0], rewards))
        if len(members) > 1:
            out.append(("worst", members[-1], rewards))
    return out


def text_of(content) -> str:
    """A message's content as text: a string, or blocks (text, tool calls and results as JSON)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(text_of(b) for b in content)
    if isinstance(content, dict):
        if isinstance(content.get("text"), str):
            return content["text"]
        if "content" in content and content.get("type") != "tool_use":
            return text_of(content["content"])
        return json.dumps(content, ensure_ascii=False)
    return str(content)


def _message(m) -> Message:
    if not isinstance(m, dict):
        return Message("user", text_of(m))
    text = text_of(m.get("content"))
    for call in m.get("tool_calls") or []:  # chat: the tool calls beside (or instead of) the text
        fn = call.get("function") or {}
        text += f"\n[tool call] {fn.get('name')}({fn.get('arguments')})"
    return Message(str(m.get("role") or m.get("type") or "?"), text.strip())


def request_messages(request: dict) -> list[Message]:
    msgs = request.get("messages")
    if msgs is None:  # Responses: `input` is a string or a list of items
        msgs = request.get("input")
        msgs = [{"role": "user", "content": msgs}] if isinstance(msgs, str) else msgs or []
    out = [_message(m) for m in msgs]
    if request.get("system"):  # Anthropic: the system prompt beside the messages
        out.insert(0, Message("system", text_of(request["system"])))
    if request.get("instructions"):  # Responses
        out.insert(0, Message("system", text_of(request["instructions"])))
    return out


def answer_message(response: dict) -> Message:
    if response.get("choices"):
        return _message(response["choices"][0].get("message") or {})
    if "content" in response:  # Anthropic
        return Message("assistant", text_of(response["content"]).strip())
    if "output" in response:  # Responses
        return Message("assistant", "\n".join(_message(o).text for o in response["output"]).strip())
    return Message("assistant", json.dumps(response)[:MAX_CHARS])


def calls_of(turns: list[dict]) -> list[Call]:
    """A rollout's turns rows (in turn order) as calls: what each request added, and the answer."""
    out, prev = [], None
    for t in turns:
        msgs = request_messages(_json(t.get("request")))
        new, resent = msgs, prev is not None
        if prev is not None and msgs[:len(prev)] == prev:
            rest = msgs[len(prev):]
            new, resent = (rest[1:] if rest and rest[0].role == "assistant" else rest), False  # its own last answer
        out.append(Call(t["turn"], new, answer_message(_json(t.get("response"))), resent,
                        t.get("finish_reason"), t.get("status")))
        prev = msgs
    return out


def _json(text) -> dict:
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def read_samples(rnd: RoundLayout, groups: int = 2) -> list[Sample]:
    """The samples of round `rnd` ([] when it has no rollouts yet or its files are unreadable)."""
    import pyarrow.parquet as pq

    try:
        rows = schema.read_table(rnd.collect.rollouts, "rollouts", [
            "rollout_id", "task_id", "group_id", "attempt", "reward", "status", "n_turns", "n_errors"]).to_pylist()
        chosen = pick(rows, groups)
        ids = sorted({r["rollout_id"] for _, r, _ in chosen})
        turns: dict[str, list[dict]] = {}
        for f in schema.shard_files(rnd.collect.turns) if ids else []:
            cols = ["rollout_id", "turn", "request", "response", "finish_reason", "status"]
            for t in pq.read_table(f, columns=cols, filters=[("rollout_id", "in", ids)]).to_pylist():
                turns.setdefault(t["rollout_id"], []).append(t)
    except Exception as e:  # noqa: BLE001  a report never stops the loop
        log.warning("report: no sample trajectories of round %d (%s)", rnd.k, e)
        return []
    return [Sample(which, r, rewards, calls_of(sorted(turns.get(r["rollout_id"], []), key=lambda t: t["turn"])))
            for which, r, rewards in chosen]
