"""Generated text -> tool calls (hermes style); the rendering of chat messages into prompt ids
lives in wharf/core/chat_template.py (convert renders text-only calls with the same function)."""
from __future__ import annotations

import json
import re
import uuid

from wharf.core.chat_template import (ChatError, normalize_messages, render_prompt_ids,  # noqa: F401 (re-exported)
                                 template_supports_tools, tools_system_block)

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
TOOL_OPEN = "<tool_call>"


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """(content before the first call or None, tool calls); ([], text) when nothing parses."""
    start = text.find(TOOL_OPEN)
    if start < 0:
        return text, []
    calls = []
    for raw in TOOL_CALL_RE.findall(text[start:]):
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            return text, []  # like vLLM's hermes parser: unparsable markup stays content
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return text, []
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append({
            "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
            "type": "function",
            "function": {"name": obj["name"],
                         "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)},
        })
    if not calls:
        return text, []
    content = text[:start].strip()
    return (content or None), calls
