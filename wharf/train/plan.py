"""Which micro-batch files make up each optimizer step, and what each step normalises by.

A pure function of index.json and the settings, so every process (and a resumed run) agrees on
the same steps without talking to the others.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from wharf.core.batches import BatchIndex


@dataclass(frozen=True)
class Step:
    epoch: int
    files: tuple[int, ...]  # positions in index.files
    rows: int
    loss_tokens: int
    tokens: int
    rollouts: float  # the sum of the rows' weights: rollouts' worth of loss tokens (loss.StepNorm)

    def for_rank(self, rank: int, world: int) -> tuple[int, ...]:
        return self.files[rank::world]


def plan_steps(index: BatchIndex, rows_per_step: int, tokens_per_step: int, epochs: int, seed: int) -> list[Step]:
    """Whole files packed into steps until rows_per_step rows or tokens_per_step loss tokens
    (0 turns a limit off; both off: one step per epoch). Epoch 0 keeps convert's order; later
    epochs shuffle the files with (seed, epoch)."""
    if epochs < 1:
        raise ValueError(f"train.epochs={epochs}: must be >= 1")
    steps: list[Step] = []
    for epoch in range(epochs):
        order = list(range(len(index.files)))
        if epoch:
            random.Random(seed * 1000 + epoch).shuffle(order)
        cur: list[int] = []
        for i in order:
            cur.append(i)
            rows = sum(index.files[j].rows for j in cur)
            toks = sum(index.files[j].loss_tokens for j in cur)
            if (rows_per_step and rows >= rows_per_step) or (tokens_per_step and toks >= tokens_per_step):
                steps.append(_step(index, epoch, cur))
                cur = []
        if cur:
            steps.append(_step(index, epoch, cur))
    return steps


def _step(index: BatchIndex, epoch: int, files: list[int]) -> Step:
    fs = [index.files[i] for i in files]
    return Step(epoch, tuple(files), sum(f.rows for f in fs), sum(f.loss_tokens for f in fs), sum(f.tokens for f in fs),
                sum(f.rollouts for f in fs))
