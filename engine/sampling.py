"""Per-row sampling with vLLM's *processed* log-probs (wharf/logprobs.py, shared with train).

vLLM (`--logprobs-mode processed_logprobs`) reports log_softmax of the logits after temperature
and top-p, and samples from that same distribution; we do the same so a stored log-prob is the
behaviour policy's. Each sequence owns its torch.Generator, so a seeded request draws the same
tokens whatever else shares its batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from wharf.logprobs import GREEDY_EPS, processed_logprobs  # noqa: F401  (batcher's names)


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


def sample(logprobs: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature < GREEDY_EPS:
        return int(torch.argmax(logprobs))
    # Exponential race: argmax(p / E) with E ~ Exp(1) draws from p, one generator call per row.
    noise = torch.empty_like(logprobs).exponential_(generator=generator)
    return int(torch.argmax(logprobs.exp() / noise))
