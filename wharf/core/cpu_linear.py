"""Linear layers on a CPU on a small C kernel instead of MKL: the engine's, and the trainer's
frozen base weights.

A decode step multiplies a few rows (one a running sequence) by every weight of the model, so it
is bound by reading the weights from memory. On an AMD EPYC host (AVX-512) torch's fp32 matmul
(MKL) read them at ~15 GB/s for one row and ~5 GB/s at 16 rows, where the same weights read once
could serve every row; cpu_linear.c does that: 1.6x torch's speed at 1 row, 2.2-2.8x at 4-64
(`python -m bench.engine_matmul`). Longer inputs (a prefill, a training row) go through it CHUNK
rows at a time, each chunk reading the weights once: ~1.6-2x torch at 128-1100 rows there. On an
Intel Xeon host MKL does better: the kernel won only at 4-32 rows. So a layer takes the kernel
at the row counts where it was timed faster on this machine (wharf/core/cpu_routes.py).

In LoRA training the base weights take no gradient, so a layer needs y = x W^T + b forward and
dx = dy W backward, both on the kernel (an autograd Function); a weight or bias that does take a
gradient (LoRA's own A and B, or full fine-tuning) stays on torch, as does anything under
autocast or off the CPU. The results agree with torch's to float rounding (the same products,
summed in another order).

The kernel is compiled once per machine with the system's C compiler (`cc -O3 -march=native
-fopenmp`) into the wharf cache (wharf/core/cbuild.py); without a compiler, or on a CPU without AVX2 +
FMA, the layers run on torch's matmul and the caller says so once. `engine.cpu_kernel: false` and
`train.cpu_kernel: false` turn it off.
"""
from __future__ import annotations

import ctypes
import logging
import types
from pathlib import Path

import torch

from . import cbuild
from .cpu_routes import Routes, routes_for

log = logging.getLogger("wharf")
SOURCE = Path(__file__).with_name("cpu_linear.c")
CHUNK = 128  # rows a kernel call: x's chunk stays in cache while the weights stream past (bench)
FLAGS = cbuild.FLAGS


def build(cache: Path, flags: list[str] = FLAGS) -> Path:
    """The compiled kernel for this CPU, source and flags, built into `cache` if not there yet."""
    return cbuild.build(SOURCE, cache, flags)


class Kernel:
    """The loaded library: `linear(x, w, b)` for a 2-D fp32 x."""

    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        self.isa = self.lib.wharf_linear_isa()
        if self.isa == 0:
            raise OSError("the CPU has neither AVX-512 nor AVX2 + FMA")
        self.lib.wharf_linear.restype = None
        self.lib.wharf_linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
        self.lib.wharf_linear_dx.restype = None
        self.lib.wharf_linear_dx.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """x [M, K] @ w[N, K].T + b, all fp32 and contiguous on the CPU."""
        M, K = x.shape
        N = w.shape[0]
        y = torch.empty((M, N), dtype=torch.float32)
        bias, threads = None if b is None else b.data_ptr(), torch.get_num_threads()
        for m in range(0, M, CHUNK):
            rows = min(CHUNK, M - m)
            self.lib.wharf_linear(x.data_ptr() + 4 * m * K, w.data_ptr(), bias, y.data_ptr() + 4 * m * N,
                                  rows, K, N, threads)
        return y

    def linear_dx(self, dy: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """dy [M, N] @ w [N, K]: the input gradient of linear(x, w), fp32 and contiguous."""
        M, N = dy.shape
        K = w.shape[1]
        dx = torch.empty((M, K), dtype=torch.float32)
        threads = torch.get_num_threads()
        for m in range(0, M, CHUNK):
            rows = min(CHUNK, M - m)
            self.lib.wharf_linear_dx(dy.data_ptr() + 4 * m * N, w.data_ptr(), dx.data_ptr() + 4 * m * K,
                                     rows, N, K, threads)
        return dx


MIN_DIM = 64  # narrower weights (LoRA's rank-r A and B) stay on torch: the lane sums would dominate


def usable(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> bool:
    """fp32 on the CPU, not autocast, a weight of at least MIN_DIM x MIN_DIM, and (under autograd)
    a weight and bias that take no gradient."""
    return (x.device.type == "cpu" and x.dtype == w.dtype == torch.float32 and w.is_contiguous()
            and min(w.shape) >= MIN_DIM
            and (b is None or b.is_contiguous()) and not torch.is_autocast_enabled("cpu")
            and (not torch.is_grad_enabled() or not (w.requires_grad or (b is not None and b.requires_grad))))


class FrozenLinear(torch.autograd.Function):
    """x [M, K] -> x W^T + b on the kernel, with dx = dy W on it too; W and b get no gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, kernel: Kernel) -> torch.Tensor:
        ctx.kernel = kernel
        ctx.save_for_backward(w)
        return kernel.linear(x, w, b)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (w,) = ctx.saved_tensors
        dx = ctx.kernel.linear_dx(dy.contiguous(), w) if ctx.needs_input_grad[0] else None
        return dx, None, None, None


def _forward(kernel: Kernel, routes: Routes):
    verdicts: dict[int, bool] = {}  # row count -> kernel?: asked 211 times a decode step

    def forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        # Read at call time: the engine's adapters swap merged weights in by reference.
        w, b = self.weight, self.bias
        rows = x.numel() // x.shape[-1]
        if (use := verdicts.get(rows)) is None:
            use = verdicts[rows] = routes.use_kernel(rows)
        if not use or not usable(x, w, b):
            return torch.nn.functional.linear(x, w, b)
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        with torch.profiler.record_function("wharf::cpu_linear"):  # its kind in bench.engine_profile
            y = FrozenLinear.apply(flat, w, b, kernel) if torch.is_grad_enabled() else kernel.linear(flat, w, b)
        return y.reshape(*x.shape[:-1], w.shape[0])
    return forward


def align(p: torch.Tensor) -> None:
    """Give `p` its own 64-byte aligned storage, the same values: weights loaded from safetensors
    sit at any offset of one buffer (40 bytes off a cache line for SmolLM2), and every vector load
    of a weight row then spans two cache lines (the kernel ran 1.7x slower on them here)."""
    if p.data_ptr() % 64:
        p.data = p.data.clone()


def install(model: torch.nn.Module, cache: Path, who: str = "engine", routes: Routes | None = None) -> Kernel | None:
    """Route the model's nn.Linear layers through the kernel at the row counts where it beats
    torch's matmul on this machine (`routes`; None: wharf/core/cpu_routes.py's, timed once here).
    None, and a warning naming `who`, where it cannot be built or loaded: the model runs as it was."""
    try:
        lib = build(cache)
        kernel = Kernel(lib)
    except OSError as e:
        log.warning("%s: linear layers run on torch's matmul (the CPU kernel is off: %s)", who, e)
        return None
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    for m in layers:
        align(m.weight)
    if routes is None:
        timed = [m.weight for m in layers if m.weight.dtype == torch.float32 and min(m.weight.shape) >= MIN_DIM]
        routes = routes_for(lib, kernel.linear, timed) if timed else Routes.everywhere()  # else none is usable()
    fwd = _forward(kernel, routes)
    for m in layers:
        m.forward = types.MethodType(fwd, m)
    log.info("%s: linear layers on the CPU kernel (AVX%d) where it is faster here: %s", who, kernel.isa,
             routes.describe())
    return kernel
