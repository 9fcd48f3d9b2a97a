"""Automatic prefix caching: the KV of token sequences already computed, reused by later prompts.

The attempts of one task send the same first prompt, and each call of a multi-turn rollout
extends the previous one; a prompt that starts with stored tokens computes only the rest. An
entry is one sequence's KV ([layers, 2, kv_heads, tokens, head_dim], a contiguous copy) under
the identity of the weights that computed it (None: the base; an adapter's name and load
number, so a reloaded or renamed adapter never matches the old entries). A lookup takes the
longest common prefix with any entry of the same identity, so a follow-up whose re-rendered
history differs from the sampled ids in one place still reuses everything before it.
Entries are kept least recently used first, within a byte budget.

Counters follow vLLM's: `queries` and `hits` count prompt tokens looked up and tokens reused.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable

import torch


@dataclass
class Entry:
    key: Hashable
    ids: torch.Tensor  # [n] int64 token ids
    kv: torch.Tensor  # [layers, 2, kv_heads, n, head_dim]

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size() + self.ids.numel() * 8


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many leading elements two 1-d tensors share."""
    n = min(len(a), len(b))
    diff = (a[:n] != b[:n]).nonzero()
    return n if len(diff) == 0 else int(diff[0, 0])


class PrefixCache:
    def __init__(self, budget_bytes: int, min_hit: int = 16):
        self.budget = budget_bytes
        # Shorter matches (the chat template's first tokens) cost more to splice than to compute.
        self.min_hit = min_hit
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # least recently used first
        self._next = 0
        self.bytes = 0
        self.queries = self.hits = 0  # prompt tokens looked up, and of them reused
        self.requests = self.hit_requests = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, key: Hashable, ids: torch.Tensor) -> tuple[int, Entry | None]:
        """The longest stored prefix of `ids` under `key` (at most len(ids) - 1 tokens: the last
        prompt token is always computed, its logits start the answer); counts nothing."""
        best, found = 0, None
        for eid, e in self._entries.items():
            if e.key == key:
                n = common_prefix(e.ids, ids)
                if n > best:
                    best, found = n, eid
        best = min(best, len(ids) - 1)
        if found is None or best < max(self.min_hit, 1):
            return 0, None
        self._entries.move_to_end(found)
        return best, self._entries[found]

    def count(self, prompt_len: int, hit: int) -> None:
        self.queries += prompt_len
        self.hits += hit
        self.requests += 1
        self.hit_requests += hit > 0

    def store(self, key: Hashable, ids: torch.Tensor, kv: torch.Tensor | Callable[[], torch.Tensor]) -> None:
        """Keep `kv` (the KV of `ids`, owned by the cache from now on; or a function that copies it
        out, called only if it is kept) under `key`; an entry that it extends is dropped, and
        nothing is added when an entry already extends it."""
        for eid, e in list(self._entries.items()):
            if e.key != key:
                continue
            n = common_prefix(e.ids, ids)
            if n == len(ids):  # already covered
                self._entries.move_to_end(eid)
                return
            if n == len(e.ids):
                self._drop(eid)
        entry = Entry(key, ids, kv() if callable(kv) else kv)
        if entry.nbytes > self.budget:
            return
        self._entries[self._next] = entry
        self._next += 1
        self.bytes += entry.nbytes
        while self.bytes > self.budget:
            self._drop(next(iter(self._entries)))
            self.evictions += 1

    def forget(self, stale: Callable[[Hashable], bool]) -> None:
        """Drop every entry whose key is stale (an adapter unloaded or replaced)."""
        for eid in [eid for eid, e in self._entries.items() if stale(e.key)]:
            self._drop(eid)

    def _drop(self, eid: int) -> None:
        self.bytes -= self._entries.pop(eid).nbytes
