"""At which row counts the CPU kernel (wharf/core/cpu_linear.c) beats torch's matmul on this machine:
timed once on the model's own weights, kept beside the compiled kernel, read on every later start.

Which one wins depends on the CPU and its BLAS. On an AMD EPYC host the kernel was 1.6x torch
(MKL) at one row and 1.6-2.8x at 4-1100 rows; on an Intel Xeon host, where MKL is at home, it was
0.93x at one row, 1.2x at 4-16 rows and 0.69-0.83x at 128-1024 rows, so there it slowed every
prefill and every training step. Each call goes to whichever was faster at the timed row count
nearest its own (log scale); the results agree to float rounding either way.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from wharf.core import atomic

BUCKETS = (1, 4, 16, 64, 256)  # rows timed; a call of more rows goes by the last (CHUNK-sized calls)
SAMPLE_BYTES = 96 << 20  # the weights timed: more than a CPU's caches hold, as the whole model is
REPEATS = 3


@dataclass(frozen=True)
class Routes:
    rows: tuple[int, ...]
    torch_ms: tuple[float, ...]  # best of REPEATS, the sample's weights once each
    kernel_ms: tuple[float, ...]

    @classmethod
    def everywhere(cls) -> Routes:
        """The kernel at every row count (tests, and a forced choice)."""
        return cls(BUCKETS, (1.0,) * len(BUCKETS), (0.0,) * len(BUCKETS))

    def use_kernel(self, m: int) -> bool:
        i = min(range(len(self.rows)), key=lambda j: abs(math.log(max(m, 1) / self.rows[j])))
        return self.kernel_ms[i] < self.torch_ms[i]

    def describe(self) -> str:
        """'kernel at 4, 16 rows, torch's matmul at 1, 64, 256+ (torch/kernel time 0.98x 1.21x ...)'."""
        def counts(kernel: bool) -> str:
            rs = [r for r in self.rows if self.use_kernel(r) == kernel]
            return ", ".join(f"{r}+" if r == self.rows[-1] else str(r) for r in rs) or "none"
        ratios = " ".join(f"{t / k:.2f}x" if k else "-" for t, k in zip(self.torch_ms, self.kernel_ms))
        return f"kernel at {counts(True)} rows, torch's matmul at {counts(False)} (torch/kernel time {ratios})"


def _pass_ms(fn: Callable, weights: list[torch.Tensor], xs: dict[int, torch.Tensor]) -> float:
    """One pass over `weights`, each times its input of the width it takes."""
    t = time.perf_counter()
    for w in weights:
        fn(xs[w.shape[1]], w)
    return (time.perf_counter() - t) * 1000


def measure(linear: Callable, weights: list[torch.Tensor], rows: tuple[int, ...] = BUCKETS,
            repeats: int = REPEATS) -> Routes:
    """Time torch's linear and `linear(x, w, None)` on `weights` at each of `rows`, alternately
    (a load on the machine slows both alike), best of `repeats`. Inputs come from a generator of
    its own: timing at a trainer's start must not move the seeded global RNG it trains with."""
    gen = torch.Generator().manual_seed(0)
    tm, km = [], []
    with torch.no_grad():
        for m in rows:
            xs = {k: torch.randn(m, k, generator=gen) for k in {w.shape[1] for w in weights}}
            t = k = float("inf")
            for _ in range(repeats):
                t = min(t, _pass_ms(lambda x, w: torch.nn.functional.linear(x, w), weights, xs))
                k = min(k, _pass_ms(lambda x, w: linear(x, w, None), weights, xs))
            tm.append(round(t, 3))
            km.append(round(k, 3))
    return Routes(tuple(rows), tuple(tm), tuple(km))


def sample(weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """The first weights up to SAMPLE_BYTES (all of a small model)."""
    out, size = [], 0
    for w in weights:
        if size >= SAMPLE_BYTES:
            break
        out.append(w.detach())
        size += w.numel() * w.element_size()
    return out


def routes_for(lib: Path, linear: Callable, weights: list[torch.Tensor]) -> Routes:
    """This machine's routes for the kernel `lib` at torch's thread count: read from beside it,
    or timed on `weights` (a sample) and written there first."""
    path = lib.with_name(f"{lib.stem}-t{torch.get_num_threads()}.routes.json")
    try:
        d = json.loads(path.read_text())
        routes = Routes(tuple(d["rows"]), tuple(d["torch_ms"]), tuple(d["kernel_ms"]))
        if routes.rows == BUCKETS and len(routes.torch_ms) == len(routes.kernel_ms) == len(BUCKETS):
            return routes
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not measured yet here, or a file from another version: measure again
    routes = measure(linear, sample(weights))
    atomic.write_json(path, asdict(routes), indent=None)  # engines starting together: the last one's stays
    return routes
