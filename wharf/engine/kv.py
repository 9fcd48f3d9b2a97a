"""The batch layout of prefill inputs and KV rows (pure tensor functions, no model).

A batch row is [padding][stored prefix][padding][computed tokens]: every part right-aligned in
its block, the padding masked out. Positions count only unmasked columns, so a row's tokens
sit at 0..n-1 whatever padding its neighbours forced on it, as in a forward of that row alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicLayer


@dataclass
class PrefillRow:
    prompt_ids: list[int]
    hit: int = 0  # leading prompt tokens whose KV is given
    kv: torch.Tensor | None = None  # [layers, 2, kv_heads, >= hit, head_dim]


@dataclass
class PrefillBatch:
    ids: torch.Tensor  # [B, S] the tokens to compute, left-padded
    mask: torch.Tensor  # [B, P + S] bool, True where a real token (stored prefix, then computed)
    mask4d: torch.Tensor  # [B, 1, S, P + S] bool: which keys each computed token attends to
    position_ids: torch.Tensor  # [B, S]
    past: list[tuple[torch.Tensor, torch.Tensor]] | None  # per layer (K, V) [B, H, P, D]; None when P = 0


def right_aligned(lengths: list[int], width: int) -> torch.Tensor:
    """[B, width] bool, row i True in its last lengths[i] columns."""
    cols = torch.arange(width)[None, :]
    return cols >= width - torch.tensor(lengths, dtype=torch.long)[:, None]


def prefill_batch(rows: list[PrefillRow], pad_id: int) -> PrefillBatch:
    hits = [r.hit for r in rows]
    todo = [r.prompt_ids[r.hit:] for r in rows]
    B, P, S = len(rows), max(hits), max(len(t) for t in todo)
    ids = torch.full((B, S), pad_id, dtype=torch.long)
    for i, t in enumerate(todo):
        ids[i, S - len(t):] = torch.tensor(t, dtype=torch.long)
    pmask, smask = right_aligned(hits, P), right_aligned([len(t) for t in todo], S)
    causal = torch.ones((S, S), dtype=torch.bool).tril()
    # Pad rows attend to themselves so no attention row is empty (an empty row gives NaN).
    own = (causal[None] & smask[:, None, :]) | torch.eye(S, dtype=torch.bool)[None]
    mask4d = torch.cat([pmask[:, None, :].expand(B, S, P), own], dim=-1)[:, None]
    position_ids = (torch.tensor(hits)[:, None] + smask.long().cumsum(-1) - 1).clamp(min=0)
    past = None
    if P > 0:
        kv0 = next(r.kv for r in rows if r.kv is not None)
        L, _, H, _, D = kv0.shape
        buf = kv0.new_zeros((L, 2, B, H, P, D))
        for i, r in enumerate(rows):
            if r.hit:
                buf[:, :, i, :, P - r.hit:] = r.kv[:, :, :, :r.hit]
        past = [(buf[l, 0], buf[l, 1]) for l in range(L)]
    return PrefillBatch(ids, torch.cat([pmask, smask], 1), mask4d, position_ids, past)


def row_kv(layers, row: int, cols: torch.Tensor) -> torch.Tensor:
    """One batch row's KV at the columns `cols` (bool [L]) as [layers, 2, H, n, D], a new tensor."""
    idx = cols.nonzero().flatten()
    n = len(idx)
    # A row's real columns are usually one run (left padding only): a slice copies it, where a
    # bool index gathers (and finds the columns again) in every one of the 2 x layers copies.
    sel = slice(int(idx[0]), int(idx[0]) + n) if n and int(idx[-1]) - int(idx[0]) + 1 == n else idx
    k0 = layers[0].keys
    out = k0.new_empty((len(layers), 2, k0.shape[1], n, k0.shape[3]))
    for l, layer in enumerate(layers):
        out[l, 0] = layer.keys[row, :, sel]
        out[l, 1] = layer.values[row, :, sel]
    return out


SLACK = 128  # columns a running batch's KV grows by at a time


class SlackLayer(DynamicLayer):
    """A cache layer whose keys and values are views of buffers with room to grow: a decode step
    writes its column in place, where DynamicLayer copies the whole cache (torch.cat) each step,
    which at agent-length contexts moves as many bytes as the weights."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: int = 0):
        super().__init__()
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._n = 0
        self._k = keys.new_empty((*keys.shape[:2], keys.shape[2] + room + SLACK, keys.shape[3]))
        self._v = torch.empty_like(self._k)
        self.update(keys, values)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n = self.reserve(key_states.shape[-2])
        self._k[:, :, n:self._n], self._v[:, :, n:self._n] = key_states, value_states
        return self.keys, self.values

    def reserve(self, s: int = 1) -> int:
        """Room for `s` more columns, which the caller writes (wharf/engine/cpu_layer.py writes a decode
        step's straight into the buffers): the first one's index."""
        n = self._n
        if n + s > self._k.shape[-2]:
            k = self._k.new_empty((*self._k.shape[:2], n + s + SLACK, self._k.shape[3]))
            v = torch.empty_like(k)
            k[:, :, :n], v[:, :, :n] = self._k[:, :, :n], self._v[:, :, :n]
            self._k, self._v = k, v
        self._n = n + s
        self.keys, self.values = self._k[:, :, :self._n], self._v[:, :, :self._n]
        return n


def slack_cache(layers, room: int = 0) -> Cache:
    """A cache of SlackLayers holding copies of the given per-layer (keys, values), with room for
    `room` more columns (a prefill's) before the slack."""
    return Cache(layers=[SlackLayer(k, v, room) for k, v in layers])


def is_slack(cache: Cache) -> bool:
    return all(isinstance(layer, SlackLayer) for layer in cache.layers)


def _left_pad(t: torch.Tensor, n: int) -> torch.Tensor:
    """t [B, H, S, D] with n zero columns before its first (dim -2)."""
    return t if n == 0 else torch.cat([t.new_zeros(*t.shape[:-2], n, t.shape[-1]), t], dim=-2)


def merge_rows(cache_a: Cache, mask_a: torch.Tensor, cache_b: Cache,
               mask_b: torch.Tensor) -> tuple[Cache, torch.Tensor]:
    """Batch b's rows after batch a's, the shorter left-padded to the longer: (a slack cache of
    both, their [Ba + Bb, L] bool mask)."""
    L = max(mask_a.shape[1], mask_b.shape[1])
    pa, pb = L - mask_a.shape[1], L - mask_b.shape[1]
    cache = slack_cache((torch.cat([_left_pad(la.keys, pa), _left_pad(lb.keys, pb)]),
                         torch.cat([_left_pad(la.values, pa), _left_pad(lb.values, pb)]))
                        for la, lb in zip(cache_a.layers, cache_b.layers))
    mask = torch.cat([torch.cat([mask_a.new_zeros(mask_a.shape[0], pa), mask_a], 1),
                      torch.cat([mask_b.new_zeros(mask_b.shape[0], pb), mask_b], 1)])
    return cache, mask


def keep_rows(cache: Cache, mask: torch.Tensor, keep: list[int]) -> tuple[Cache, torch.Tensor]:
    """Only the rows `keep` of a batch (a slack cache, its mask), without the leading columns
    that are padding in every one of them."""
    idx = torch.tensor(keep, dtype=torch.long)
    mask = mask[idx]
    first = int(mask.any(0).long().argmax())
    return slack_cache((l.keys[idx, :, first:], l.values[idx, :, first:]) for l in cache.layers), mask[:, first:]
