"""Length bucketing of rows into padded micro-batches (pure; numpy in, MicroBatch out).

Rows sorted by length (longest first, ties broken by a seeded permutation) are cut into
micro-batches of as many rows as fit `max_tokens` padded tokens (rows x padded length), each
padded to its longest row rounded up to `pad_multiple`. Neighbours in that order have nearly the
same length, so little is padding. The micro-batches are then shuffled with the same seed: the
same rows and seed always give the same batches in the same order.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from wharf.core.batches import PAD_ID, MicroBatch


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def plan_batches(lengths: np.ndarray, max_tokens: int, pad_multiple: int = 1, seed: int = 0,
                 max_row_padding: float = 1.0) -> list[np.ndarray]:
    """Row lengths -> micro-batches as arrays of row indices, in training order. A row joins a
    micro-batch while the batch fits `max_tokens` and the row is at least (1 - max_row_padding)
    of the batch's padded length (padding is compute thrown away: a few more, smaller batches
    are cheaper than one half empty). A row longer than `max_tokens` is a micro-batch alone."""
    lengths = np.asarray(lengths, np.int64)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(lengths))
    order = perm[np.argsort(-lengths[perm], kind="stable")]
    neg_sorted = -lengths[order]  # ascending, for searchsorted
    batches, i = [], 0
    while i < len(order):
        t = round_up(int(lengths[order[i]]), pad_multiple)  # the longest of what is left
        end = i + max(1, max_tokens // max(t, 1))
        end = min(end, max(i + 1, int(np.searchsorted(neg_sorted, -(1 - max_row_padding) * t, side="right"))))
        batches.append(order[i:end])
        i = end
    return [batches[j] for j in rng.permutation(len(batches))]


def padding_fraction(lengths: np.ndarray, batches: Sequence[np.ndarray], pad_multiple: int = 1) -> float:
    """Share of padded positions that are padding."""
    lengths = np.asarray(lengths, np.int64)
    padded = sum(len(b) * round_up(int(lengths[b].max()), pad_multiple) for b in batches if len(b))
    return 1.0 - lengths.sum() / padded if padded else 0.0


def naive_batches(n_rows: int, rows_per_batch: int, seed: int = 0) -> list[np.ndarray]:
    """The baseline: rows in shuffled order, a fixed number per batch, each padded to its longest."""
    perm = np.random.default_rng(seed).permutation(n_rows)
    return [perm[i:i + rows_per_batch] for i in range(0, n_rows, max(1, rows_per_batch))]


def pack(rows: Sequence, pad_multiple: int, advantages: np.ndarray, weights: np.ndarray,
         rollout_index: np.ndarray, group_index: np.ndarray) -> MicroBatch:
    """Rows (convert.rows.Row) and their per-row values -> one right-padded MicroBatch
    (layout: wharf/core/batches.py)."""
    b = len(rows)
    t = round_up(max(len(r) for r in rows), pad_multiple)
    ids = np.full((b, t), PAD_ID, np.int64)
    attn = np.zeros((b, t), np.int64)
    cmask = np.zeros((b, t), np.float32)
    lps = np.zeros((b, t), np.float32)
    for i, r in enumerate(rows):
        r.fill(ids[i], cmask[i], lps[i])
        attn[i, :len(r)] = 1
    pos = np.arange(t, dtype=np.int64)[None, :] * attn
    temps = np.array([r.temperature for r in rows], np.float32)
    t_ = torch.from_numpy
    return MicroBatch(
        input_ids=t_(ids), attention_mask=t_(attn), position_ids=t_(pos), completion_mask=t_(cmask),
        old_logprobs=t_(lps), advantages=t_(np.asarray(advantages, np.float32)),
        weights=t_(np.asarray(weights, np.float32)), temperatures=t_(temps),
        rollout_index=t_(np.asarray(rollout_index, np.int64)), group_index=t_(np.asarray(group_index, np.int64)))
