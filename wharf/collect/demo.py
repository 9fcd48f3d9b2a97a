"""`wharf chat --config FILE`: start the endpoint if needed and show one real chat
completion with its token ids and per-token log-probs (what the recording proxy will capture)."""
from __future__ import annotations

from openai import OpenAI

from wharf.engine.launch import launch
from wharf.core.config import cli_config
from wharf.core.entry import guarded

PROMPT = "Write a shell command that prints the current directory."


def main(argv: list[str] | None = None, prog: str = "wharf chat") -> int:
    cfg = cli_config(argv, prog, "One chat completion from the endpoint, with its token ids and log-probs.")
    return guarded(prog, lambda: _chat(cfg))


def _chat(cfg) -> int:
    with launch(cfg) as ep:
        client = OpenAI(base_url=f"{ep.url}/v1", api_key=ep.api_key or "EMPTY")  # the SDK wants one
        max_tokens = min(cfg.sampling.max_tokens or 48, 48)
        r = client.chat.completions.create(
            model=cfg.endpoint.model, messages=[{"role": "user", "content": PROMPT}],
            temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p, max_tokens=max_tokens,
            seed=cfg.engine.seed, logprobs=True, extra_body={"return_token_ids": True})
    choice = r.choices[0]
    ids = choice.model_extra["token_ids"]
    prompt_ids = r.model_extra["prompt_token_ids"]
    print(f"endpoint {cfg.endpoint.url} ({cfg.endpoint.kind}), model {r.model}, "
          f"temperature {cfg.sampling.temperature}, top_p {cfg.sampling.top_p}")
    print(f"user: {PROMPT}")
    print(f"prompt: {len(prompt_ids)} token ids: {prompt_ids[:12]}{' ...' if len(prompt_ids) > 12 else ''}")
    print(f"\n{'#':>3} {'id':>6} {'logprob':>9}  token")
    for k, (tid, e) in enumerate(zip(ids, choice.logprobs.content)):
        print(f"{k:>3} {tid:>6} {e.logprob:>9.4f}  {e.token!r}")
    total = sum(e.logprob for e in choice.logprobs.content)
    print(f"\nassistant ({choice.finish_reason}, {r.usage.completion_tokens} tokens, "
          f"sum logprob {total:.3f}):\n{choice.message.content}")
    return 0
