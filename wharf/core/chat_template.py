"""Chat messages -> prompt token ids, as the local engine renders them at sampling time (and as
convert renders a text-only call for SFT: the same function, so the rows hold exactly the ids the
student will be prompted with).

A template that knows about tools gets `tools=` directly. SmolLM2's template does not, so the
tools go into a hermes-style system block, assistant tool calls are rendered as
`<tool_call>{json}</tool_call>` and tool results as `<tool_response>` blocks, the format
vLLM's hermes parser reads back. A family whose template knows only user and model turns
(Gemma: ChatStyle.tool_results_as_user, from wharf/core/families.py) gets tool results as user
turns, consecutive ones joined, so that its template's strict alternation holds.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChatStyle:
    """A model's rendering quirks (wharf/core/families.py chat_style builds it)."""

    tool_results_as_user: bool = False
    # The tokens that end an assistant turn (where the engine stops), beside the tokenizer's eos.
    turn_ends: tuple[str, ...] = ()


PLAIN = ChatStyle()


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


def normalize_messages(messages: Any, tools: list[dict] | None, native_tools: bool,
                       style: ChatStyle = PLAIN) -> list[dict]:
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
    return _tool_results_as_user(out) if style.tool_results_as_user and not native_tools else out


def _tool_results_as_user(messages: list[dict]) -> list[dict]:
    """Tool results as user turns, each run of user turns joined into one."""
    out: list[dict] = []
    for m in messages:
        m = {**m, "role": "user"} if m["role"] == "tool" else m
        if out and m["role"] == "user" and out[-1]["role"] == "user":
            out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n{m['content']}"}
        else:
            out.append(m)
    return out


def render_text(tokenizer, messages: Any, tools: list[dict] | None = None, *,
                add_generation_prompt: bool = True, continue_final_message: bool = False,
                chat_template_kwargs: dict | None = None, style: ChatStyle = PLAIN) -> str:
    """The template's text for these messages (tools inlined where the template has no tool support)."""
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise ChatError("tools: expected a list of {type: function, function: {...}} objects")
    native = bool(tools) and template_supports_tools(tokenizer)
    msgs = normalize_messages(messages, tools, native, style)
    kwargs = dict(chat_template_kwargs or {})
    if native:
        kwargs["tools"] = tools
    try:
        return tokenizer.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message, **kwargs)
    except Exception as e:  # jinja errors from the model's template
        raise ChatError(f"messages: the chat template failed: {e}") from None


def render_prompt_ids(tokenizer, messages: Any, tools: list[dict] | None = None, *,
                      add_generation_prompt: bool = True, continue_final_message: bool = False,
                      chat_template_kwargs: dict | None = None, style: ChatStyle = PLAIN) -> list[int]:
    text = render_text(tokenizer, messages, tools, add_generation_prompt=add_generation_prompt,
                       continue_final_message=continue_final_message, chat_template_kwargs=chat_template_kwargs,
                       style=style)
    # The template already holds every special token; the tokenizer must not add a BOS.
    return tokenizer.encode(text, add_special_tokens=False)


def render_answer_ids(tokenizer, messages: Any, tools: list[dict] | None, answer: dict,
                      chat_template_kwargs: dict | None = None, style: ChatStyle = PLAIN) -> list[int]:
    """The ids a model prompted with render_prompt_ids(messages, tools) would generate to give
    `answer` (an assistant message: content and/or tool_calls): what the template writes for that
    turn after the generation prompt, up to and including the first token that ends a turn (the
    model stops there; the template's glue after it is the next prompt's). A template that
    re-renders history (the full text does not start with the prompt's) gets the message's text
    and the end-of-turn token."""
    kw = {"chat_template_kwargs": chat_template_kwargs, "style": style}
    prompt = render_text(tokenizer, messages, tools, **kw)
    full = render_text(tokenizer, [*messages, answer], tools, add_generation_prompt=False, **kw)
    ends = [e for e in (*style.turn_ends, tokenizer.eos_token) if e]
    if full.startswith(prompt):
        text = full[len(prompt):]
        found = [(text.index(e) + len(e)) for e in ends if e in text]
        if found:
            text = text[:min(found)]
    else:
        native = bool(tools) and template_supports_tools(tokenizer)
        text = normalize_messages([answer], tools if native else None, native)[0]["content"] + (ends[0] if ends else "")
    return tokenizer.encode(text, add_special_tokens=False)
