"""A scripted expert for the warm-start experiment: an OpenAI-compatible chat endpoint that answers
mini-swe-agent's text-based prompts in mini's own format, reading only the conversation.

It sees what a model would see (the instruction in the first user message, the command outputs
mini shows it after each action), never the task's files, values or solution: it plays the
intended solution of the multi-turn tasks (datasets/multiturn): run the command the instruction
names; then run the command that output shows (its last line with an `echo ... > file`), or the
instruction's placeholder command (`echo NUMBER > count.txt`) with the placeholder replaced by the
first number the output holds; then submit. Each answer is a THOUGHT paragraph and one
```mswea_bash_command block, as mini_textbased.yaml asks. It returns no token ids or log-probs
(a teacher: record it with proxy.text_only=true).

`python -m testing.scripted_expert --port 8300`, or `ExpertServer().start()` in a thread.
"""
from __future__ import annotations

import argparse
import json
import re
import time
import uuid

from aiohttp import web

from testing.app_thread import AppThread

FENCE = "mswea_bash_command"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
FIRST = re.compile(r"First run this command to see it:\s*\n\s*\n?(.+)")
PLACEHOLDER = re.compile(r"Then run this command with (\w+) replaced by what you saw:\s*\n\s*\n?(.+)")
OUTPUT = re.compile(r"<output>\n?(.*?)</output>", re.S)
SHOWN = re.compile(r"(echo .+>\s*\S+)\s*$")
NUMBER = re.compile(r"-?\d+(?:\.\d+)*")


def _text(content) -> str:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def next_command(messages: list[dict]) -> tuple[str, str]:
    """(thought, command) for the conversation so far; a pure function of the messages."""
    users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    done = sum(m.get("role") == "assistant" for m in messages)
    if not users:
        return "There is no task in the conversation.", SUBMIT
    task = users[0]
    first = FIRST.search(task)
    if done == 0 and first:
        return "The instruction names the command that shows what I need; I run it first.", first.group(1).strip()
    if done == 1 and first:
        seen = OUTPUT.search(users[-1])
        out = (seen.group(1) if seen else users[-1]).strip()
        slot = PLACEHOLDER.search(task)
        if slot:
            value = NUMBER.search(out)
            if value:
                return (f"The output shows {value.group(0)}; I put it in place of {slot.group(1)}.",
                        slot.group(2).strip().replace(slot.group(1), value.group(0)))
        for line in reversed(out.splitlines()):
            shown = SHOWN.search(line)
            if shown:
                return "The output shows the command to run; I run it as shown.", shown.group(1).strip()
    return "The task is done; I submit.", SUBMIT


def answer_text(messages: list[dict]) -> str:
    thought, cmd = next_command(messages)
    return f"THOUGHT: {thought}\n\n```{FENCE}\n{cmd}\n```"


def _completion(body: dict, text: str) -> dict:
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model") or "expert",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}


async def chat(request: web.Request) -> web.StreamResponse:
    try:
        body = json.loads(await request.read())
        messages = body["messages"]
    except (ValueError, KeyError, TypeError):
        return web.json_response({"error": {"message": "expected a JSON body with messages", "type": "BadRequestError",
                                            "code": 400}}, status=400)
    out = _completion(body, answer_text(messages))
    if not body.get("stream"):
        return web.json_response(out)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    base = {k: out[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    msg = out["choices"][0]["message"]
    for choice in ({"index": 0, "delta": msg, "finish_reason": None}, {"index": 0, "delta": {}, "finish_reason": "stop"}):
        await resp.write(b"data: " + json.dumps({**base, "choices": [choice]}).encode() + b"\n\n")
    if (body.get("stream_options") or {}).get("include_usage"):
        await resp.write(b"data: " + json.dumps({**base, "choices": [], "usage": out["usage"]}).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "expert", "object": "model", "owned_by": "wharf"}]})


def app() -> web.Application:
    a = web.Application()
    a.router.add_post("/v1/chat/completions", chat)
    a.router.add_get("/v1/models", models)
    a.router.add_get("/health", health)
    return a


class ExpertServer(AppThread):
    """The expert on its own event loop in a daemon thread (tests): `url` once started."""

    def __init__(self, port: int = 0):
        super().__init__(app, port, "scripted-expert")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8300)
    args = p.parse_args()
    web.run_app(app(), host=args.host, port=args.port, access_log=None)


if __name__ == "__main__":
    main()
