"""What each agent recorded of its own model calls, read from the logs it left in the trial's
agent/ dir, so a collected round can be checked call for call against the proxy's rows.

Readers, tried in order (the first whose file is there wins):
- minimal agent: trajectory.json in format wharf-minimal/1 (each call, failed ones included);
- mini-swe-agent: mini-swe-agent.trajectory.json (every raw response, parsed or not);
- claude-code: claude-code.txt, its `--output-format=stream-json` events (one message id per call);
- codex: sessions/**/rollout-*.jsonl, its session transcript (one token_count event per call, the
  ids of the items each call returned);
- opencode: its session database, opencode/xdg-data/opencode/opencode.db (one assistant message per
  call of the conversation, with the ids of the items it got back and its prompt size; the title it
  set for the session is the one side call's answer, which its --format=json events leave out; its
  text log is not read: it may end before the last call's line is written);
- qwen-code: its chat recording, qwen-sessions/**/chats/*.jsonl (one assistant record per call);
- gemini-cli: its session file, gemini-cli.trajectory.jsonl (or .json before 0.40; one `gemini`
  message per call, rewritten in place as its tool calls finish);
- mistral-vibe 2.x: its session journal, vibe-home/logs/session/unified/*/journal/*.jsonl (a
  `completion` action per call, its result with the answer's parts and usage);
- aider: its LLM history, aider.llm.history.txt (one `LLM RESPONSE <time>` block per call, written
  when the call ends, failed or not);
- openhands: its completions log, completions/*.json (one file per call that got an answer, which
  it writes itself; harbor's ATIF trajectory.json from its events may hold several steps per call);
- any other harbor agent: trajectory.json in ATIF (agent steps that carry metrics).
Calls that failed and that the agent retried leave no trace in the logs of claude-code, codex or
ATIF agents: those are compared with the proxy's ok rows only (`counts_errors` False).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from wharf.collect.agents.calls import AgentCall, item_call
from wharf.collect.agents.calls import read_jsonl as _jsonl
from wharf.collect.agents.gemini_session import read_session
from wharf.collect.agents.opencode_db import read_session_db

_MINIMAL = "trajectory.json"  # collect.agents.minimal (format wharf-minimal/1), or ATIF
_MINI_SWE = "mini-swe-agent.trajectory.json"
_CLAUDE = "claude-code.txt"
_CODEX_SESSIONS = "sessions"
_AIDER = "aider.llm.history.txt"  # collect.agents.aider sets it
_GEMINI = ("gemini-cli.trajectory.jsonl", "gemini-cli.trajectory.json")  # harbor copies the session there
_OPENHANDS = "completions"  # harbor's OpenHands sets LLM_LOG_COMPLETIONS_FOLDER to it


@dataclass
class AgentLog:
    source: str  # which log was read
    calls: list[AgentCall]
    counts_errors: bool  # failed calls are in `calls` (as calls without text)
    # Calls made beside the conversation, at no fixed place in the order (opencode's session title):
    # their rows are the ones whose answer no call in `calls` names (all of those carry ids).
    side: list[AgentCall] = field(default_factory=list)


def _minimal(data) -> list[AgentCall] | None:
    if isinstance(data, dict) and "calls" in data:
        return [AgentCall(text=c.get("assistant")) for c in data["calls"]]
    if isinstance(data, list):  # a flat list of {assistant: ...} (test agents)
        return [AgentCall(text=c.get("assistant")) for c in data]
    return None


def _atif(data: dict) -> list[AgentCall]:
    calls = []
    for s in data.get("steps") or ():
        if s.get("source") == "agent" and s.get("metrics"):
            msg = s.get("message")
            calls.append(AgentCall(prompt_tokens=(s.get("metrics") or {}).get("prompt_tokens"),
                                   text=msg if isinstance(msg, str) else None))
    return calls


def _mini_swe(path: Path) -> list[AgentCall]:
    # Every model call leaves its raw response in some message's `extra`: on the assistant
    # message, or on the user message that rejected a malformed or cut-off answer.
    calls = []
    for m in json.loads(path.read_text()).get("messages", []):
        response = (m.get("extra") or {}).get("response")
        if isinstance(response, dict) and response.get("choices"):
            calls.append(AgentCall(text=response["choices"][0]["message"].get("content") or ""))
        elif m.get("role") == "assistant":
            calls.append(AgentCall(text=m.get("content") or ""))
    return calls


def _claude(path: Path) -> list[AgentCall]:
    """Assistant events grouped by message id (a call's blocks may come as several events);
    locally made messages (model <synthetic>: an API error shown to the user) are not calls."""
    calls: dict[str, AgentCall] = {}
    for e in _jsonl(path):
        m = e.get("message") if e.get("type") == "assistant" else None
        if not isinstance(m, dict) or not m.get("id") or m.get("model") == "<synthetic>":
            continue
        call = calls.setdefault(m["id"], AgentCall(text="", response_ids={m["id"]},
                                                   prompt_tokens=(m.get("usage") or {}).get("input_tokens")))
        call.text += "".join(b.get("text", "") for b in m.get("content") or () if b.get("type") == "text")
    return list(calls.values())


def _codex(files: list[Path]) -> list[AgentCall]:
    calls: list[AgentCall] = []
    pending: set[str] = set()
    texts: list[str] = []
    for f in files:
        for e in _jsonl(f):
            p = e.get("payload") or {}
            if e.get("type") == "response_item" and isinstance(p.get("id"), str) and item_call(p["id"]):
                pending.add("resp_" + item_call(p["id"]))
                if p.get("type") == "message":
                    texts += [c.get("text", "") for c in p.get("content") or () if c.get("type") == "output_text"]
            elif e.get("type") == "event_msg" and p.get("type") == "token_count" and (p.get("info") or {}):
                last = p["info"].get("last_token_usage") or {}
                calls.append(AgentCall(text="".join(texts), response_ids=pending,
                                       prompt_tokens=last.get("input_tokens")))
                pending, texts = set(), []
    return calls


def _qwen(files: list[Path]) -> list[AgentCall]:
    calls = []
    for f in files:
        for e in _jsonl(f):
            if e.get("type") == "assistant" and isinstance(e.get("message"), dict):
                parts = e["message"].get("parts") or ()
                calls.append(AgentCall(text="".join(p.get("text", "") for p in parts if not p.get("thought")),
                                       prompt_tokens=(e.get("usageMetadata") or {}).get("promptTokenCount")))
    return calls


_AIDER_HEAD = re.compile(r"^(TO LLM|LLM RESPONSE) \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d$")


def _lines(text: str) -> str:
    return "\n".join(text.splitlines())  # aider logs an answer line by line: its last newline is lost


def _aider(path: Path) -> list[AgentCall]:
    calls: list[AgentCall] = []
    body: list[str] | None = None  # the lines of the LLM RESPONSE block being read
    for line in path.read_text(errors="replace").splitlines() + ["TO LLM 0000-00-00T00:00:00"]:
        head = _AIDER_HEAD.match(line)
        if head and body is not None:
            calls.append(AgentCall(text="\n".join(body), derive=_lines))
            body = None
        if head:
            body = [] if head.group(1) == "LLM RESPONSE" else None
        elif body is not None:
            body.append(line.removeprefix("ASSISTANT").removeprefix(" "))
    return calls


def _vibe(files: list[Path]) -> list[AgentCall]:
    """Completion actions, each answered by a result record carrying the same action_id."""
    asked: list[str] = []
    answers: dict[str, dict] = {}
    for f in files:
        for e in _jsonl(f):
            p = e.get("payload") or {}
            if p.get("kind") == "completion" and p.get("action_id"):
                asked.append(p["action_id"])
            elif isinstance((p.get("result") or {}).get("result"), dict) and p.get("action_id"):
                answers.setdefault(p["action_id"], p["result"]["result"])
    calls = []
    for a in dict.fromkeys(asked):  # a retried action is one call
        r = answers.get(a) or {}
        text = "".join(x.get("text", "") for x in r.get("parts") or () if x.get("type") == "text")
        calls.append(AgentCall(text=text if r else None, prompt_tokens=(r.get("usage") or {}).get("input_tokens")))
    return calls


def _openhands(files: list[Path]) -> list[AgentCall]:
    """Each file holds one call's answer as litellm returned it, and when it was written."""
    logged = [json.loads(f.read_text()) for f in files]
    calls = []
    for d in sorted(logged, key=lambda d: d.get("timestamp") or 0):
        resp = d.get("response") or {}
        msg = (resp.get("choices") or [{}])[0].get("message") or {}
        calls.append(AgentCall(text=msg.get("content") or "", response_ids={resp["id"]} if resp.get("id") else set(),
                               prompt_tokens=(resp.get("usage") or {}).get("prompt_tokens")))
    return calls


def read_agent_log(agent_dir: Path) -> AgentLog | None:
    """The agent's own record of its model calls, in order; None when it left none we read."""
    agent_dir = Path(agent_dir)
    if (agent_dir / _MINI_SWE).is_file():
        return AgentLog("mini-swe-agent trajectory", _mini_swe(agent_dir / _MINI_SWE), True)
    if (agent_dir / _CLAUDE).is_file():
        return AgentLog("claude-code stream-json", _claude(agent_dir / _CLAUDE), False)
    rollouts = sorted((agent_dir / _CODEX_SESSIONS).rglob("rollout-*.jsonl")) if (agent_dir / _CODEX_SESSIONS).is_dir() else []
    if rollouts:
        return AgentLog("codex session", _codex(rollouts), False)
    oc_db = agent_dir / "opencode" / "xdg-data" / "opencode" / "opencode.db"
    if oc_db.is_file():
        calls, side = read_session_db(oc_db)
        return AgentLog("opencode session database", calls, False, side)
    chats = sorted((agent_dir / "qwen-sessions").glob("**/chats/*.jsonl")) if (agent_dir / "qwen-sessions").is_dir() else []
    if chats:
        return AgentLog("qwen-code chat recording", _qwen(chats), False)
    gemini = next((agent_dir / f for f in _GEMINI if (agent_dir / f).is_file()), None)
    if gemini is not None:
        return AgentLog("gemini-cli session", read_session(gemini), False)
    vibe = agent_dir / "vibe-home" / "logs" / "session" / "unified"
    if vibe.is_dir():  # journal files are numbered in write order
        return AgentLog("vibe session journal", _vibe(sorted(vibe.glob("*/journal/*.jsonl"))), False)
    if (agent_dir / _AIDER).is_file():
        return AgentLog("aider LLM history", _aider(agent_dir / _AIDER), False)
    completions = sorted((agent_dir / _OPENHANDS).glob("*.json")) if (agent_dir / _OPENHANDS).is_dir() else []
    if completions:
        return AgentLog("openhands completions log", _openhands(completions), False)
    own = agent_dir / _MINIMAL
    if own.is_file():
        try:
            data = json.loads(own.read_text())
        except ValueError:
            return None
        calls = _minimal(data)
        if calls is not None:
            return AgentLog("wharf trajectory", calls, True)
        if isinstance(data, dict) and "steps" in data:
            return AgentLog("ATIF trajectory", _atif(data), False)
    return None


def row_text(row: dict) -> str:
    """The assistant text of a recorded answer, whichever API it was given in."""
    resp = json.loads(row["response"]) if row.get("response") else {}
    if row.get("api") == "anthropic":
        return "".join(b.get("text", "") for b in resp.get("content") or () if b.get("type") == "text")
    if row.get("api") == "gemini":
        parts = ((resp.get("candidates") or [{}])[0].get("content") or {}).get("parts") or ()
        return "".join(p.get("text", "") for p in parts if not p.get("thought"))
    if row.get("api") == "responses":
        return "".join(c.get("text", "") for it in resp.get("output") or () if it.get("type") == "message"
                       for c in it.get("content") or () if c.get("type") == "output_text")
    return ((resp.get("choices") or [{}])[0].get("message") or {}).get("content") or ""


def _answer_id(row: dict) -> str | None:
    return json.loads(row["response"]).get("id") if row.get("response") else None


def compare(rows: list[dict], log: AgentLog, where: str) -> list[str]:
    """Problems between a rollout's rows (in turn order) and its agent's log; [] when they match."""
    if not log.counts_errors:
        rows = [r for r in rows if r["status"] == "ok"]
    side: list[dict] = []
    if log.side:
        named = set().union(*(c.response_ids for c in log.calls))
        side = [r for r in rows if _answer_id(r) not in named]
        rows = [r for r in rows if _answer_id(r) in named]
    if len(rows) + len(side) != len(log.calls) + len(log.side) or len(side) != len(log.side):
        beside = (f" ({len(side)} beside the conversation)", f" ({len(log.side)} beside it)") if log.side else ("", "")
        return [f"{where}: {len(rows) + len(side)} {'ok ' if not log.counts_errors else ''}turns rows{beside[0]} "
                f"but {len(log.calls) + len(log.side)} model calls{beside[1]} in the agent's {log.source}"]
    problems = [p for r, call in zip(side, log.side) for p in _check(r, call, where)]
    return problems + [p for r, call in zip(rows, log.calls) for p in _check(r, call, where)]


def _check(r: dict, call: AgentCall, where: str) -> list[str]:
    if r["status"] != "ok" or (call.text is None and not call.response_ids):
        return []
    problems = []
    resp_id = _answer_id(r)
    if call.response_ids and resp_id not in call.response_ids:
        problems.append(f"{where} turn {r['turn']}: the agent logged answer {sorted(call.response_ids)}, "
                        f"the row holds {resp_id}")
    text = call.derive(row_text(r)) if call.derive else row_text(r)
    if call.text is not None and text != call.text:
        problems.append(f"{where} turn {r['turn']}: recorded response differs from the agent's text")
    if call.prompt_tokens is not None and not r.get("text_only") and call.prompt_tokens != len(r["prompt_token_ids"]):
        problems.append(f"{where} turn {r['turn']}: the agent saw {call.prompt_tokens} prompt tokens, "
                        f"the row holds {len(r['prompt_token_ids'])} ids")
    return problems
