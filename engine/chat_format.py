"""Chat messages -> prompt token ids, and generated text -> tool calls (hermes style).

A template that knows about tools gets `tools=` directly. SmolLM2's template does not, so the
tools go into a hermes-style system block, assistant tool calls are rendered as
`<tool_call>{json}</tool_call>` and tool results as `<tool_response>` blocks, the format
vLLM's hermes parser reads back.
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Any

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
TOOL_OPEN = "<tool_call>"


class ChatError(ValueError):
    """A message list the template cannot render; the message names the field."""


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text parts
        parts = []
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise ChatError(f"{where}.content[{j}]: only text parts are supported, got {part!r:.80}")
        return "\n".join(parts)
    raise ChatError(f"{where}.content: expected a string or a list of text parts, got {type(content).__name__}")


def tools_system_block(tools: list[dict]) -> str:
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{lines}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def _render_tool_call(call: Any, where: str) -> str:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ChatError(f"{where}: expected {{'function': {{'name': ..., 'arguments': ...}}}}")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            pass  # keep the agent's string as it was
    return "<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


def template_supports_tools(tokenizer) -> bool:
    return "tools" in (tokenizer.chat_template or "")


def normalize_messages(messages: Any, tools: list[dict] | None, native_tools: bool) -> list[dict]:
    """Check the messages and, for a template without tool support, inline the tool parts."""
    if not isinstance(messages, list) or not messages:
        raise ChatError("messages: expected a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ChatError(f"{where}: expected an object with a string 'role'")
        role = m["role"]
        if role == "developer":
            role = "system"
        text = _text(m.get("content"), where)
        if native_tools:
            out.append({**m, "role": role, "content": text})
            continue
        if role == "assistant" and m.get("tool_calls"):
            if not isinstance(m["tool_calls"], list):
                raise ChatError(f"{where}.tool_calls: expected a list")
            calls = [_render_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(m["tool_calls"])]
            text = "\n".join(([text] if text else []) + calls)
        elif role == "tool":
            text = f"<tool_response>\n{text}\n</tool_response>"
        out.append({"role": role, "content": text})
    if tools and not native_tools:
        block = tools_system_block(tools)
        if out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def render_prompt_ids(tokenizer, messages: Any, tools: list[dict] | None = None, *,
                      add_generation_prompt: bool = True, continue_final_message: bool = False,
                      chat_template_kwargs: dict | None = None) -> list[int]:
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise ChatError("tools: expected a list of {type: function, function: {...}} objects")
    native = bool(tools) and template_supports_tools(tokenizer)
    msgs = normalize_messages(messages, tools, native)
    kwargs = dict(chat_template_kwargs or {})
    if native:
        kwargs["tools"] = tools
    try:
        text = tokenizer.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message, **kwargs)
    except Exception as e:  # jinja errors from the model's template
        raise ChatError(f"messages: the chat template failed: {e}") from None
    # The template already holds every special token; the tokenizer must not add a BOS.
    return tokenizer.encode(text, add_special_tokens=False)


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
