"""Trajectory files -> the chat calls they hold (pure; no I/O): each call is the conversation the
model was sent and the assistant message it answered, in the OpenAI chat form the proxy records.

- ATIF (harbor's trajectory.json, `schema_version: ATIF-v1.x`): validated with harbor's own
  Trajectory model; system and user steps are messages, each agent step is a call (its message
  and tool calls the answer), its observation results come back as tool messages (to its tool
  calls) or as one user message (text-based agents such as mini-swe-agent, terminus-2).
  Steps marked is_copied_context were not generated there and are context only.
- mini-swe-agent's own trajectory (`trajectory_format: mini-swe-agent-1.x`): its `messages` are
  exactly what its model was sent; every assistant message is a call; a tool-calling run's calls
  carry mini's bash tool (what its tool-calling models send; the file does not hold it).
- wharf's own minimal agent's trajectory.json (`format: wharf-minimal/1`,
  wharf/collect/agents/minimal.py): each call holds the messages it sent and the assistant text;
  a call the endpoint failed has no answer and is left out.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from wharf.core.errors import UsageError, WharfError

_KEEP = ("role", "content", "tool_calls", "tool_call_id", "name")


class TrajectoryError(WharfError, ValueError):
    """A trajectory file that cannot be imported; the message names the file and the field."""


class ImportUsageError(UsageError, TrajectoryError):
    """The import's command line is wrong (a path that is not there, arguments swapped, a file
    named twice, a reward that is not a number): exit 2."""


@dataclass
class Trajectory:
    format: str  # atif | mini
    agent: str
    model: str | None
    tools: list[dict] | None
    calls: list[tuple[list[dict], dict]] = field(default_factory=list)  # (request messages, answer)


MINIMAL = "wharf-minimal/1"  # wharf/collect/agents/minimal.py's TRAJECTORY_FORMAT (collect stays apart from agents)


def detect(data, where: str) -> str:
    if isinstance(data, dict) and str(data.get("schema_version", "")).startswith("ATIF"):
        return "atif"
    if isinstance(data, dict) and str(data.get("trajectory_format", "")).startswith("mini-swe-agent"):
        return "mini"
    if isinstance(data, dict) and data.get("format") == MINIMAL:
        return "minimal"
    raise TrajectoryError(f"{where}: neither an ATIF trajectory (schema_version: ATIF-v1.x), mini-swe-agent's "
                          f"(trajectory_format: mini-swe-agent-1.x) nor wharf's minimal agent's (format: {MINIMAL})")


def parse(data, where: str) -> Trajectory:
    kind = detect(data, where)
    traj = {"atif": parse_atif, "mini": parse_mini, "minimal": parse_minimal}[kind](data, where)
    if not traj.calls:
        raise TrajectoryError(f"{where}: no model call in it (no agent step / assistant message)")
    return traj


def _text(content) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "\n".join(p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text")


def parse_atif(data: dict, where: str) -> Trajectory:
    from harbor.models.trajectories.trajectory import Trajectory as Atif
    from pydantic import ValidationError

    try:
        t = Atif.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise TrajectoryError(f"{where}: {loc}: {err['msg']} (not a valid ATIF trajectory)") from None
    out = Trajectory("atif", t.agent.name, t.agent.model_name, t.agent.tool_definitions or None)
    messages: list[dict] = []
    for s in t.steps:
        if s.source != "agent":
            messages.append({"role": s.source, "content": _text(s.message)})
            continue
        answer: dict = {"role": "assistant", "content": _text(s.message) or None}
        if s.tool_calls:
            answer["tool_calls"] = [{"id": c.tool_call_id, "type": "function", "function": {
                "name": c.function_name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                for c in s.tool_calls]
        if not s.is_copied_context:
            out.calls.append((list(messages), answer))
        messages.append(answer)
        messages.extend(_observation(s, where))
    return out


def _observation(step, where: str) -> list[dict]:
    results = step.observation.results if step.observation else []
    if not step.tool_calls:
        text = "\n".join(_text(r.content) for r in results)
        return [{"role": "user", "content": text}] if results else []
    ids = [c.tool_call_id for c in step.tool_calls]
    out = []
    for j, r in enumerate(results):
        # unlinked results (harbor's mini-swe-agent converter) answer the step's calls in order
        call = r.source_call_id if r.source_call_id is not None else ids[min(j, len(ids) - 1)]
        if call not in ids:
            raise TrajectoryError(f"{where}: steps[{step.step_id}].observation.results[{j}].source_call_id: "
                                  f"{call!r} names none of the step's tool calls")
        out.append({"role": "tool", "tool_call_id": call, "content": _text(r.content)})
    return out


def parse_mini(data: dict, where: str) -> Trajectory:
    msgs = data.get("messages")
    if not isinstance(msgs, list):
        raise TrajectoryError(f"{where}: messages: missing or not a list (a mini-swe-agent trajectory holds its "
                              "conversation there)")
    out = Trajectory("mini", "mini-swe-agent", _mini_model(data, where), None)
    messages: list[dict] = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise TrajectoryError(f"{where}: messages[{i}].role: missing (mini-swe-agent's chat-completions "
                                  "trajectories only; a Responses API trajectory is not imported)")
        if m["role"] not in ("system", "user", "assistant", "tool"):
            continue  # mini's own markers (the `exit` message), never sent to the model
        if m["role"] != "tool" and not isinstance(m.get("content"), (str, list, type(None))):
            raise TrajectoryError(f"{where}: messages[{i}].content: expected text")
        if m.get("tool_calls") is not None:
            check_tool_calls(m["tool_calls"], f"{where}: messages[{i}].tool_calls")
        msg = {k: m[k] for k in _KEEP if m.get(k) is not None}
        msg["content"] = _text(m.get("content")) if m.get("content") is not None else None
        if m["role"] == "assistant":
            if not msg.get("content") and not msg.get("tool_calls"):
                raise TrajectoryError(f"{where}: messages[{i}]: an assistant message with neither content "
                                      "nor tool_calls")
            out.calls.append((list(messages), msg))
        messages.append(msg)
    if any(a.get("tool_calls") for _, a in out.calls):  # its tool-calling models send their one tool
        out.tools = [mini_bash_tool()]
    return out


def _mini_model(data: dict, where: str) -> str | None:
    """info.config.model.model_name, where mini-swe-agent writes the model; each level a mapping."""
    node, path = data, ""
    for key in ("info", "config", "model"):
        node, path = node.get(key), f"{path}.{key}".lstrip(".")
        if node is None:
            return None
        if not isinstance(node, dict):
            raise TrajectoryError(f"{where}: {path}: expected a mapping (mini-swe-agent writes its run's settings "
                                  f"there), got {node!r:.60}")
    name = node.get("model_name")
    if name is not None and not isinstance(name, str):
        raise TrajectoryError(f"{where}: info.config.model.model_name: expected text, got {name!r:.60}")
    return name


def check_tool_calls(calls, where: str) -> None:
    """OpenAI chat's form: a list of {id, type: function, function: {name, arguments (JSON text)}}."""
    if not isinstance(calls, list):
        raise TrajectoryError(f"{where}: expected a list of tool calls, got {type(calls).__name__} {calls!r:.60}")
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
            raise TrajectoryError(f"{where}[{j}]: expected {{\"function\": {{\"name\": text, \"arguments\": JSON "
                                  f"text}}}}, got {c!r:.80}")


def parse_minimal(data: dict, where: str) -> Trajectory:
    calls = data.get("calls")
    if not isinstance(calls, list):
        raise TrajectoryError(f"{where}: calls: missing or not a list (wharf's minimal agent records each model "
                              "call there)")
    model = data.get("model") if isinstance(data.get("model"), str) else None
    out = Trajectory("minimal", str(data.get("agent") or "wharf-minimal"), model, None)
    for i, call in enumerate(calls):
        if not isinstance(call, dict) or not isinstance(call.get("messages"), list):
            raise TrajectoryError(f"{where}: calls[{i}].messages: missing or not a list")
        answer = call.get("assistant")
        if answer is not None and not isinstance(answer, str):
            raise TrajectoryError(f"{where}: calls[{i}].assistant: expected text, got {answer!r:.60}")
        if not answer:
            continue  # the endpoint failed this call (or answered nothing): no answer to learn from
        for j, m in enumerate(call["messages"]):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise TrajectoryError(f"{where}: calls[{i}].messages[{j}]: expected {{\"role\": text, "
                                      "\"content\": text}")
        messages = [{"role": m["role"], "content": m["content"]} for m in call["messages"]]
        out.calls.append((messages, {"role": "assistant", "content": call["assistant"]}))
    return out


def mini_bash_tool() -> dict:
    """mini-swe-agent's BASH_TOOL, read from its source: importing minisweagent reads (and may
    write) the user's global mini config."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("minisweagent")
    if spec is None or not spec.submodule_search_locations:
        raise TrajectoryError("a tool-calling mini-swe-agent trajectory needs mini-swe-agent installed (its bash tool)")
    src = Path(spec.submodule_search_locations[0]) / "models" / "utils" / "actions_toolcall.py"
    for node in ast.parse(src.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "BASH_TOOL" for t in node.targets):
            return ast.literal_eval(node.value)
    raise TrajectoryError(f"{src}: no BASH_TOOL (another mini-swe-agent version?)")
