"""Per-row sampling with vLLM's *processed* log-probs (wharf/core/logprobs.py, shared with train).

vLLM (`--logprobs-mode processed_logprobs`) reports log_softmax of the logits after temperature
and top-p, and samples from that same distribution; we do the same so a stored log-prob is the
behaviour policy's. Each sequence owns its torch.Generator, so a seeded request draws the same
tokens whatever else shares its batch.
"""
from __future__ import annotations

from dataclasses import dataclass
import torch

from wharf.core.logprobs import GREEDY_EPS, processed_logprobs

from .cpu_race import Race, torch_race

LOGPROB_FLOOR = -9999.0  # vLLM clamps -inf to this in responses


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
                generators: list[torch.Generator | None], race: Race | None = None) -> torch.Tensor:
    """One token per row of [B, V] log-probs (argmax where the temperature is ~0); returns [B] ids.

    Each drawn row's noise comes from its own generator, so a seeded request draws the same tokens
    whatever shares its batch. `race` (wharf/engine/cpu_race.py) draws the same tokens as torch_race,
    faster; where it cannot, torch_race does."""
    ids = logprobs.argmax(-1)
    drawn = [k for k, t in enumerate(temperatures) if t >= GREEDY_EPS]
    if drawn:
        p = logprobs.exp()
        gens = [generators[k] or torch.default_generator for k in drawn]
        got = race.draw(p, drawn, gens) if race is not None else None
        ids[drawn] = got if got is not None else torch_race(p[drawn], gens)
    return ids


def next_tokens(logits: torch.Tensor, params: list[SamplingParams], n_out: list[int], eos_ids: set[int],
                generators: list[torch.Generator | None],
                race: Race | None = None) -> list[tuple[int, float, list[tuple[int, float]]]]:
    """(token id, its processed log-prob, the top alternatives) for each row of [B, V] float32
    logits, row k sampled under params[k] with n_out[k] tokens generated so far."""
    # The common case (top_p = 1, no banned tokens) in one batched log_softmax; the rest per row.
    temps = torch.tensor([max(p.temperature, 0.0) for p in params])
    temps = torch.where(temps < GREEDY_EPS, torch.ones_like(temps), temps)
    lp = torch.log_softmax(logits / temps[:, None], dim=-1)
    for k, p in enumerate(params):
        if n_out[k] < p.min_tokens or p.top_p < 1.0:
            row = logits[k].clone()
            if n_out[k] < p.min_tokens:
                row[list(eos_ids | set(p.stop_token_ids))] = float("-inf")
            lp[k] = processed_logprobs(row, p.temperature, p.top_p)
    tids = sample_rows(lp, [p.temperature for p in params], generators, race)
    chosen = lp.gather(1, tids[:, None])[:, 0].clamp(min=LOGPROB_FLOOR).tolist()
    out = []
    for k, (p, tid) in enumerate(zip(params, tids.tolist())):
        top: list[tuple[int, float]] = []
        if p.top_logprobs > 0:
            vals, idx = torch.topk(lp[k], p.top_logprobs)
            top = [(int(j), max(float(v), LOGPROB_FLOOR)) for v, j in zip(vals, idx)]
        out.append((tid, chosen[k], top))
    return out
