"""The prefix-cache rows of `python -m bench.engine`: what a round's calls cost with the engine's
prefix cache on and off, on a ~1,000-token prompt (a task statement with a log to read):

- one attempt: a prompt no earlier call shares (beyond the template's system prompt), cold;
- a group of 4 attempts: the same new prompt sent 4 times at once (GRPO's attempts of one task);
- a follow-up: the rollout's next call (its first call, the answer, one more user message),
  timed after the first call.

Every call generates exactly `tokens` tokens (ignore_eos), so on and off compare like with like.
`chat_fn(messages, seed)` is the backend: the engine over HTTP, or llama.cpp in-process (llamacpp.py).
"""
from __future__ import annotations

import concurrent.futures
import time
from typing import Callable

from openai import OpenAI

FOLLOW_UP = "Now list the workers that took more than 10 ms, one per line."
ROWS = ("one attempt", "group of 4 attempts", "follow-up call")

ChatFn = Callable[[list[dict], int], str]


def long_prompt(nonce: str, lines: int = 50) -> list[dict]:
    """~1,000 tokens for 50 lines; the nonce leads, so prompts of different nonces share nothing
    beyond the chat template's system prompt."""
    log = "\n".join(f"{i:04d} INFO worker-{i % 7} processed batch {i * 37 % 1000} in {i % 13 + 1} ms"
                    for i in range(lines))
    return [{"role": "user", "content": f"Session {nonce}. Here is a service log:\n{log}\n"
                                        "Which worker processed the most batches, and how long did it take in all?"}]


def engine_chat(url: str, api_key: str | None, tokens: int, model: str = "smollm2-135m") -> ChatFn:
    client = OpenAI(base_url=f"{url}/v1", api_key=api_key or "EMPTY", max_retries=0, timeout=600)

    def chat(messages: list[dict], seed: int) -> str:
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=tokens, temperature=1.0,
                                           seed=seed, extra_body={"ignore_eos": True})
        return r.choices[0].message.content or ""

    return chat


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def prefix_rows(chat: ChatFn, tag: str, concurrent_ok: bool = True) -> dict[str, float]:
    """Seconds for each of ROWS. `tag` makes this backend's prompts new to it; a backend that
    serves one call at a time (llama.cpp here) gets the group one after another."""
    one = _timed(lambda: chat(long_prompt(f"{tag}-one"), 0))
    group = long_prompt(f"{tag}-group")
    if concurrent_ok:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            t_group = _timed(lambda: list(pool.map(lambda i: chat(group, i), range(4))))
    else:
        t_group = _timed(lambda: [chat(group, i) for i in range(4)])
    first = long_prompt(f"{tag}-turn")
    answer = chat(first, 0)
    follow = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": FOLLOW_UP}]
    return dict(zip(ROWS, (one, t_group, _timed(lambda: chat(follow, 1)))))


def print_prefix_table(on: dict[str, float], off: dict[str, float], anchor: dict[str, float] | None) -> None:
    """Seconds per row, cache on against off (and llama.cpp's where it ran), with the ratios the
    issue targets: a group against one attempt, a follow-up against the same call cold."""
    head = f"{'call':<22} {'cache on s':>10} {'cache off s':>11} {'on/off':>7}"
    print(head + (f" {'llama.cpp s':>11} {'on/llama.cpp':>12}" if anchor else ""))
    for row in ROWS:
        line = f"{row:<22} {on[row]:>10.2f} {off[row]:>11.2f} {on[row] / off[row]:>6.2f}x"
        if anchor:
            line += f" {anchor[row]:>11.2f} {on[row] / anchor[row]:>11.2f}x"
        print(line)
    group = {name: t[ROWS[1]] / t[ROWS[0]] for name, t in (("cache on", on), ("cache off", off), ("llama.cpp", anchor))
             if t}
    print("a group of 4 against one attempt: " + ", ".join(f"{name} {x:.2f}x" for name, x in group.items()))
    print(f"a follow-up against the same call cold (cache off): {on[ROWS[2]] / off[ROWS[2]]:.2f}x")
