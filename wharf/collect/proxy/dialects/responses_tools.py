"""Tools of the Responses dialect (codex): namespaces flattened to chat functions, custom (freeform)
tools as functions of one string `input`, hosted tools dropped; and chat tool calls mapped back to
the items codex reads (function_call with its namespace, custom_tool_call)."""
from __future__ import annotations

from wharf.collect.proxy.dialects import DialectError, parse_args

_CUSTOM_PARAMS = {"type": "object", "properties": {"input": {"type": "string", "description": "the tool's raw input"}},
                  "required": ["input"]}


def _members(tools) -> list[tuple[dict, str | None]]:
    """(tool, namespace) for every callable tool, namespaces opened up; hosted tools left out."""
    out = []
    for t in tools if isinstance(tools, list) else ():
        if not isinstance(t, dict):
            continue
        if t.get("type") == "namespace":
            out += [(m, t.get("name")) for m in t.get("tools") or () if isinstance(m, dict)
                    and m.get("type") in ("function", "custom")]
        elif t.get("type") in ("function", "custom"):
            out.append((t, None))
    return out


def tool_map(req: dict) -> dict[str, dict]:
    """chat function name -> {name, namespace, custom}: how a chat tool call goes back to the agent.
    A pure function of the request, so the answer side needs no state from the request side."""
    members = _members(req.get("tools"))
    plain = {str(t.get("name")) for t, ns in members if ns is None}
    out: dict[str, dict] = {}
    for t, ns in members:
        name = str(t.get("name"))
        chat_name = name if ns is None or name not in plain else f"{ns}.{name}"
        out.setdefault(chat_name, {"name": name, "namespace": ns, "custom": t.get("type") == "custom"})
    return out


def chat_name(name: str, namespace, tmap: dict) -> str:
    """The chat function name of a call in the agent's history (the inverse of tool_map)."""
    for chat_name, v in tmap.items():
        if v["name"] == name and v["namespace"] == (namespace or None):
            return chat_name
    return name if not namespace else f"{namespace}.{name}"


def chat_tools(tools, tmap: dict, dropped: list) -> list[dict]:
    if not isinstance(tools, list):
        raise DialectError("'tools' must be a list")
    for j, t in enumerate(tools):
        if not isinstance(t, dict):
            raise DialectError(f"tools[{j}]: expected an object, got {type(t).__name__}")
        if t.get("type") not in ("function", "custom", "namespace"):
            dropped.append(str(t.get("type")))
        elif t.get("type") == "namespace" and not isinstance(t.get("tools"), list):
            raise DialectError(f"tools[{j}]: a namespace needs a 'tools' list")
    by_name = {(t.get("name"), ns): t for t, ns in _members(tools)}
    out = []
    for chat_name, v in tmap.items():
        t = by_name[(v["name"], v["namespace"])]
        if not isinstance(t.get("name"), str):
            raise DialectError(f"tools: a {t.get('type')} tool needs a 'name' string")
        params = _CUSTOM_PARAMS if v["custom"] else t.get("parameters") or {"type": "object", "properties": {}}
        fn = {"name": chat_name, "parameters": params}
        if t.get("description"):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def tool_choice(tc, tmap: dict):
    if tc in ("auto", "none", "required"):
        return tc
    if isinstance(tc, dict) and tc.get("type") in ("function", "custom") and isinstance(tc.get("name"), str):
        return {"type": "function", "function": {"name": chat_name(tc["name"], tc.get("namespace"), tmap)}}
    raise DialectError(f"tool_choice {tc!r}: expected auto, none, required or {{\"type\": \"function\", \"name\": ...}}")


def call_item(sfx: str, i: int, call_id: str, name: str, arguments: str, status: str, tmap: dict) -> dict:
    """A chat tool call as the agent's item: a function_call (with its namespace, if it has one),
    or a custom_tool_call carrying the raw input."""
    v = tmap.get(name) or {"name": name, "namespace": None, "custom": False}
    if v["custom"]:
        args = parse_args(arguments)
        raw = args["input"] if isinstance(args.get("input"), str) else arguments
        return {"id": f"ctc_{sfx}_{i}", "type": "custom_tool_call", "status": status, "call_id": call_id,
                "name": v["name"], "input": raw}
    item = {"id": f"fc_{sfx}_{i}", "type": "function_call", "status": status, "call_id": call_id, "name": v["name"],
            "arguments": arguments}
    if v["namespace"]:
        item["namespace"] = v["namespace"]
    return item
