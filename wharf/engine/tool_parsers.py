"""Generated text -> OpenAI tool calls, one parser per tool-call format, as vLLM's
`--tool-call-parser` reads them (facts read off vllm/entrypoints/openai/tool_parsers/:
hermes_tool_parser.py, llama_tool_parser.py, mistral_tool_parser.py, pythonic_tool_parser.py).

Each parser is a pure function text -> (content or None, calls); text that does not parse as
its format's calls comes back whole as content with no calls, as vLLM does, so a malformed call
reaches the agent as text rather than vanishing. Where the engine takes its parser from:
`pick` (the served model's family, or engine.tool_parser).
"""
from __future__ import annotations

import ast
import json
import random
import re
import string
import uuid
import warnings
from dataclasses import dataclass
from typing import Any, Callable

Parsed = tuple[str | None, list[dict]]


@dataclass(frozen=True)
class ToolParser:
    name: str
    parse: Callable[[str], Parsed]
    opens: tuple[str, ...]  # where a call may begin: a stream holds text back from the first one
    at_start: bool = False  # a call counts only at the very start of the text (pythonic)
    # The format's marker is a special token (Mistral's [TOOL_CALLS]): the text is decoded with
    # special tokens kept, as vLLM's mistral parser has it (skip_special_tokens=false).
    keep_special: bool = False

    def hold_from(self, text: str, final: bool) -> int:
        """Where the part of `text` that is, or may still become, a call begins (len: none)."""
        if self.at_start:
            may = any(text.startswith(o) or (not final and o.startswith(text)) for o in self.opens)
            return 0 if text and may else len(text)
        found = [at for at in (text.find(o) for o in self.opens) if at >= 0]
        if found:
            return min(found)
        if not final:  # the text may end in the first characters of a marker
            for k in range(max(len(o) for o in self.opens) - 1, 0, -1):
                if any(len(o) > k and text.endswith(o[:k]) for o in self.opens):
                    return len(text) - k
        return len(text)


def _call(name: str, arguments: str, call_id: str | None = None) -> dict:
    return {"id": call_id or f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


# -- hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block per call ---------
HERMES_OPEN = "<tool_call>"
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_hermes(text: str) -> Parsed:
    """Content is the text before the first block (stripped); an unclosed last block counts."""
    start = text.find(HERMES_OPEN)
    if start < 0:
        return text, []
    calls = []
    for raw in _HERMES_BLOCK.findall(text[start:]):
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            return text, []
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return text, []
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append(_call(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)))
    if not calls:
        return text, []
    return (text[:start].strip() or None), calls


# -- llama3_json: {"name": ..., "parameters": {...}}, optionally after <|python_tag|>, ";" between --
PYTHON_TAG = "<|python_tag|>"


def parse_llama3_json(text: str) -> Parsed:
    """Every JSON object in the text is a call ({name, arguments or parameters}, at any depth),
    whatever lies between them (`;` as Llama writes it, or words); content None, as vLLM returns
    it. One `{` that does not start such an object leaves the whole text content."""
    decoder, calls, pos = json.JSONDecoder(), [], text.find("{")
    while pos >= 0:
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return text, []
        if not isinstance(obj.get("name"), str) or not ("arguments" in obj or "parameters" in obj):
            return text, []
        args = obj["arguments"] if "arguments" in obj else obj["parameters"]
        calls.append(_call(obj["name"], json.dumps(args, ensure_ascii=False)))
        pos = text.find("{", end)
    return (None, calls) if calls else (text, [])


# -- mistral: [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]; v11+: [TOOL_CALLS]name[ARGS]{...}
TOOL_CALLS = "[TOOL_CALLS]"
_MISTRAL_ID_CHARS = string.ascii_letters + string.digits


def _mistral_id() -> str:
    # Mistral's templates refuse tool-call ids that are not 9 letters or digits; vLLM makes these.
    return "".join(random.choices(_MISTRAL_ID_CHARS, k=9))


def _mistral_content(text: str) -> str | None:
    return text[:text.find(TOOL_CALLS)] or None  # not stripped, as vLLM


def parse_mistral(text: str) -> Parsed:
    """Tokenizers before v11: one [TOOL_CALLS], then a JSON list of {name, arguments} (what
    follows the list is ignored). vLLM returns only the text after the marker as content when
    the list does not parse; here the whole text stays content, as with every other parser."""
    if text.count(TOOL_CALLS) != 1:
        return text, []
    rest = text.split(TOOL_CALLS, 1)[1].strip()
    try:
        items, _ = json.JSONDecoder().raw_decode(rest)
    except json.JSONDecodeError:
        return text, []
    if not isinstance(items, list) or not items or not all(
            isinstance(c, dict) and isinstance(c.get("name"), str) for c in items):
        return text, []
    calls = [_call(c["name"], json.dumps(c.get("arguments", {}), ensure_ascii=False), _mistral_id()) for c in items]
    return _mistral_content(text), calls


def parse_mistral_v11(text: str) -> Parsed:
    """Tokenizers v11 on: [TOOL_CALLS]name{json} per call ([ARGS] between them where the
    tokenizer's text keeps it); the arguments are passed on as written, as vLLM does."""
    if TOOL_CALLS not in text:
        return text, []
    calls = []
    for raw in text.split(TOOL_CALLS)[1:]:
        brace = raw.find("{")
        if brace < 0:
            continue
        calls.append(_call(raw[:brace].replace("[ARGS]", ""), raw[brace:], _mistral_id()))
    return (_mistral_content(text), calls) if calls else (text, [])


# -- pythonic: [f(a=1), g(b="x")], parsed with ast (never evaluated) ------------------------------
_NAME = re.compile(r"[a-zA-Z]\w*")


class _NotACall(ValueError):
    pass


def _literal(node: ast.expr) -> Any:
    """A JSON value from a literal: strings, numbers, booleans, None, lists and dicts of them."""
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (str, int, float))):
        return node.value
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant)
            and type(node.operand.value) in (int, float)):
        return -node.operand.value
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys):
        return {k.value: _literal(v) for k, v in zip(node.keys, node.values)}
    raise _NotACall(ast.dump(node))


def _pythonic_call(node: ast.expr) -> dict:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and _NAME.fullmatch(node.func.id)):
        raise _NotACall("not a call of a plain name")
    if node.args or any(k.arg is None for k in node.keywords):
        raise _NotACall("positional or ** arguments")
    args = {k.arg: _literal(k.value) for k in node.keywords}
    return _call(node.func.id, json.dumps(args, ensure_ascii=False))


def parse_pythonic(text: str) -> Parsed:
    """A list of calls with keyword arguments of literal values, at the very start of the text;
    content None. vLLM refuses a negative number (an operator in Python's tree); here it is one."""
    if not text.startswith("["):
        return text, []
    try:
        with warnings.catch_warnings():  # a string's invalid escape warns; it is still text
            warnings.simplefilter("ignore")
            body = ast.parse(text).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return text, []
    value = getattr(body[0], "value", None) if body else None
    if not isinstance(value, ast.List) or not value.elts:
        return text, []
    try:
        return None, [_pythonic_call(e) for e in value.elts]
    except (_NotACall, RecursionError):
        return text, []


HERMES = ToolParser("hermes", parse_hermes, (HERMES_OPEN,))
LLAMA3_JSON = ToolParser("llama3_json", parse_llama3_json, (PYTHON_TAG, "{"))
MISTRAL = ToolParser("mistral", parse_mistral, (TOOL_CALLS,), keep_special=True)
MISTRAL_V11 = ToolParser("mistral", parse_mistral_v11, (TOOL_CALLS,), keep_special=True)
PYTHONIC = ToolParser("pythonic", parse_pythonic, ("[",), at_start=True)
PARSERS = {p.name: p for p in (HERMES, LLAMA3_JSON, MISTRAL, PYTHONIC)}  # engine.tool_parser's choices


def pick(setting: str, family_parser: str | None, native_tools: bool, vocab: dict) -> tuple[ToolParser, str]:
    """The parser the engine reads tool calls with, and why, for its log.

    `auto`: a chat template that renders the tools itself asks for its family's format (hermes
    for a model type wharf/core/families.py does not list); one that does not (SmolLM2, Gemma)
    gets wharf's hermes block in the system turn (wharf/core/chat_template.py), so hermes."""
    if setting != "auto":
        if setting not in PARSERS:
            raise ValueError(f"engine.tool_parser={setting!r}: choose one of auto, {', '.join(PARSERS)}")
        parser, why = PARSERS[setting], "engine.tool_parser"
    elif native_tools:
        parser, why = PARSERS[family_parser or "hermes"], "the family's format; its chat template renders the tools"
    else:
        parser, why = HERMES, "the chat template has no tools: wharf writes the hermes block into the system turn"
    if parser is MISTRAL and "[ARGS]" in vocab:  # vLLM tells the v11 tokenizers by this token
        parser = MISTRAL_V11
    return parser, why
