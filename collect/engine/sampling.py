"""Per-row sampling with vLLM's *processed* log-probs.

vLLM (`--logprobs-mode processed_logprobs`) reports log_softmax of the logits after temperature
and top-p, and samples from that same distribution; we do the same so a stored log-prob is the
behaviour policy's. Each sequence owns its torch.Generator, so a seeded request draws the same
tokens whatever else shares its batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

GREEDY_EPS = 1e-5  # vLLM treats temperatures below this as greedy


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    top_logprobs: int = 0  # top alternatives to report per position


def processed_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """log_softmax(logits / T) over a 1-D vocab row, with tokens outside the top-p set at -inf."""
    logits = logits.float()
    if temperature >= GREEDY_EPS:
        logits = logits / temperature
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(0, order, sorted_logits)
    return torch.log_softmax(logits, dim=-1)


def sample(logprobs: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature < GREEDY_EPS:
        return int(torch.argmax(logprobs))
    # Exponential race: argmax(p / E) with E ~ Exp(1) draws from p, one generator call per row.
    noise = torch.empty_like(logprobs).exponential_(generator=generator)
    return int(torch.argmax(logprobs.exp() / noise))
