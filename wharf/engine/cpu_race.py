"""The sampling race on a small C kernel: the same tokens as torch's, several times faster.

wharf/engine/sampling.py draws each row's token as argmax(p / E), E ~ Exp(1) from the row's own
torch.Generator, so a seeded request draws the same tokens whatever shares its batch. torch fills
all V = 49,152 noise values of a row one by one, a log1p each: ~0.7 ms a row, 11 ms of an ~80 ms
decode step at 16 rows. cpu_race.c draws the same uniforms from the generator's mt19937 state and
computes the log1p only where it can change the winner, so the token and the generator's state
afterwards are bit for bit torch's (checked here against torch when the kernel loads; if torch
ever draws otherwise, the engine says so and keeps torch's race).
"""
from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import torch

from wharf.core import cbuild

log = logging.getLogger("wharf.engine")
SOURCE = Path(__file__).with_name("cpu_race.c")
STATE_BYTES = 5056  # a CPU torch.Generator's get_state(): the layout cpu_race.c reads


def torch_race(p: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """Exponential race: argmax(p / E) with E ~ Exp(1) draws from p. [R, V] probabilities -> [R]
    ids, row k's noise from generators[k] (None: torch's default generator)."""
    noise = torch.empty_like(p)
    for k, g in enumerate(generators):
        noise[k].exponential_(generator=g)
    return (p / noise).argmax(-1)


class Race:
    """The loaded kernel: `draw(p, rows, generators)`."""

    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        self.lib.wharf_race_rows.restype = ctypes.c_int
        self.lib.wharf_race_rows.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]

    def draw(self, p: torch.Tensor, rows: list[int], generators: list[torch.Generator]) -> torch.Tensor | None:
        """For each rows[r] of [B, V] fp32 probabilities `p`, the race's index with generators[r]
        (advanced as torch would); None, every generator untouched, where the kernel cannot."""
        if not rows:
            return torch.empty(0, dtype=torch.long)
        states = [g.get_state() for g in generators]
        if p.dtype != torch.float32 or not p.is_contiguous() or any(s.numel() != STATE_BYTES for s in states):
            return None
        out = torch.empty(len(rows), dtype=torch.long)
        index = torch.tensor(rows, dtype=torch.long)
        ptrs = (ctypes.c_void_p * len(states))(*[s.data_ptr() for s in states])
        with torch.profiler.record_function("wharf::race"):  # its kind in bench.engine_profile
            rc = self.lib.wharf_race_rows(p.data_ptr(), index.data_ptr(), len(rows), p.shape[1], ptrs,
                                          out.data_ptr(), torch.get_num_threads())
        if rc != 0:
            return None
        for g, s in zip(generators, states):
            g.set_state(s)
        return out

    def agrees_with_torch(self, vocab: int = 4099, rows: int = 5) -> bool:
        """Both races on seeded random rows, twice over (the second from where the first left the
        generators): the same ids and the same generator states."""
        logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(7)) * 3
        p = torch.softmax(logits, -1)
        ours = [torch.Generator().manual_seed(100 + k) for k in range(rows)]
        theirs = [torch.Generator().manual_seed(100 + k) for k in range(rows)]
        for _ in range(2):
            got = self.draw(p, list(range(rows)), ours)
            if got is None or not torch.equal(got, torch_race(p, theirs)):
                return False
        return all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(ours, theirs))


def load(cache: Path) -> Race | None:
    """The kernel, built and checked against torch; None (and a warning) where it cannot be."""
    try:
        race = Race(cbuild.build(SOURCE, cache))
    except OSError as e:
        log.warning("engine: sampling draws its noise on torch (the race kernel is off: %s)", e)
        return None
    if not race.agrees_with_torch():
        log.warning("engine: sampling draws its noise on torch (the race kernel does not draw as "
                    "this torch %s does)", torch.__version__)
        return None
    log.info("engine: sampling draws on the race kernel")
    return race
