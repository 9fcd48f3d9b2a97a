"""The stub's toy tokenizer and chat template (testing/vllm_stub.py serves them).

Word-level ids (a CRC of each word, so the same text always gets the same ids) and a ChatML-like
template that renders a tool call back exactly as the stub wrote it, the way vLLM hands a
Hermes-style template the parsed arguments: a conversation that sends back what it got extends
its prompt token for token.
"""
from __future__ import annotations

import json
import re
import zlib

EOS_ID = 2
IM_START, IM_END = 1, 2
WORD = re.compile(r"\S+\s*|\s+")
VOCAB = [w + " " for w in "the a model tool call file test pass fix bug run code line value read write list".split()]


def word_id(word: str) -> int:
    return 100 + zlib.crc32(word.encode()) % 49000


def tokenize(text: str) -> list[int]:
    return [word_id(w) for w in WORD.findall(text)]


def tool_call_text(name, arguments) -> str:
    """A tool call as the stub writes it, and as its template renders it back: the way vLLM hands a
    template the parsed arguments and a Hermes-style template dumps them, so a conversation that sends
    back what it got extends its prompt token for token (convert's one row per rollout)."""
    try:
        arguments = json.dumps(json.loads(arguments)) if isinstance(arguments, str) else json.dumps(arguments)
    except ValueError:
        pass  # not JSON: rendered as sent
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {arguments}}}\n</tool_call>'


def render_prompt(messages: list, tools: list | None) -> list[int]:
    """ChatML-like rendering: <|im_start|>role\\ncontent<|im_end|> per message, then the assistant header."""
    ids: list[int] = []
    if tools:
        ids += [IM_START] + tokenize("system tools: " + json.dumps(tools, sort_keys=True)) + [IM_END]
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        text = f"{m.get('role')}\n{content or ''}"
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", {})
            text += tool_call_text(fn.get("name"), fn.get("arguments"))
        ids += [IM_START] + tokenize(text) + [IM_END]
    return ids + [IM_START] + tokenize("assistant\n")
