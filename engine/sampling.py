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


def sample_rows(logprobs: torch.Tensor, temperatures: list[float],
                generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of [B, V] log-probs (argmax where the temperature is ~0); returns [B] ids.

    Exponential race: argmax(p / E) with E ~ Exp(1) draws from p. Each row's noise comes from its
    own generator, so a seeded request draws the same tokens whatever shares its batch."""
    greedy = torch.tensor([t < GREEDY_EPS for t in temperatures])
    noise = torch.ones_like(logprobs)
    for k, g in enumerate(generators):
        if not greedy[k]:
            noise[k].exponential_(generator=g)
    return torch.where(greedy, logprobs.argmax(-1), (logprobs.exp() / noise).argmax(-1))
