"""A request's sequence as the batcher runs it, the events it emits, and when it stops."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .sampling import SamplingParams


@dataclass
class Token:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class Done:
    finish_reason: str  # stop | length | abort
    stop_reason: int | str | None = None


@dataclass
class Failed:
    message: str


@dataclass
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    emit: Callable[[Token | Done | Failed], None]  # must be thread-safe
    adapter: str | None = None  # None: the base model
    output_ids: list[int] = field(default_factory=list)
    cancelled: bool = False
    generator: torch.Generator | None = None
    finished: bool = False
    failed: bool = False
    # Set at admission: the identity of the weights it runs on (prefix cache key), and the
    # prompt tokens whose KV came from the cache.
    cache_key: Any = None
    hit: int = 0
    past: Any = None  # the prefix cache entry it starts from, until prefilled

    def cancel(self) -> None:
        self.cancelled = True


def stop_of(s: Sequence, tid: int, eos_ids: set[int], max_model_len: int,
            decode: Callable[[list[int]], str]) -> Done | None:
    """Why `s` stops after its newest token `tid` (already in s.output_ids), or None to go on.
    `decode(ids)` is the tokenizer's text of ids (special tokens skipped), for the stop strings."""
    p = s.params
    if tid in p.stop_token_ids and len(s.output_ids) > p.min_tokens - 1:
        return Done("stop", tid)
    if tid in eos_ids and not p.ignore_eos:
        return Done("stop", None)
    if p.stop:
        # Only the tail can contain a new match: decode a window, not the whole output.
        window = max(len(x) for x in p.stop) + 16
        text = decode(s.output_ids[-window:])
        for stop in p.stop:
            if stop and stop in text:
                return Done("stop", stop)
    if len(s.output_ids) >= p.max_tokens:
        return Done("length")
    if len(s.prompt_ids) + len(s.output_ids) >= max_model_len:
        return Done("length")
    return None
