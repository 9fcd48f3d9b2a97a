"""vLLM's *processed* log-probs, the one definition the engine samples from and the trainer must
reproduce: log_softmax of the logits after temperature and top-p.

vLLM (`--logprobs-mode processed_logprobs`) reports these and samples from that same
distribution, so a stored log-prob is the behaviour policy's."""
from __future__ import annotations

import torch

GREEDY_EPS = 1e-5  # vLLM treats temperatures below this as greedy


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
