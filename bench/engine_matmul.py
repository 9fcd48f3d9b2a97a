"""`python -m bench.engine_matmul [--rows 1 4 16 32]`: the linear layers of one decode step, torch's
fp32 matmul (MKL) against the engine's C kernel (wharf/core/cpu_linear.c), side by side.

A decode step multiplies every running sequence's row by all of the model's weights. This runs
the 210 projections of SmolLM2-135M (30 layers x q, k, v, o, gate, up, down; 425 MB of fp32
weights, each a separate tensor as in the model, so every step streams them from memory) and the
tied 49,152 x 576 head, at a few row counts, and prints the best of --repeats for each (the two
taken in turn, timed as wharf/core/cpu_routes.py times them for the engine), the ratio,
and the weight bandwidth each implies. At one row both are bound by reading the weights; at 4-16
rows torch's matmul slows down while the kernel still reads each weight once; a prefill's
hundreds of rows go through the kernel 128 at a time.
"""
from __future__ import annotations

from wharf.core import envdefaults

envdefaults.apply()  # before torch loads

import argparse  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402

# SmolLM2-135M: hidden 576, MLP 1536, 9 query heads and 3 KV heads of 64, 30 layers, vocabulary 49,152
LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # (out, in)
HEAD = (49152, 576)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.engine_matmul", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 32, 128, 1024],
                    help="rows a step: decode (one a running sequence), prefill (prompt tokens)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    from wharf.core import cpu_linear
    from wharf.core.cpu_routes import measure
    from wharf.core.model_store import cache_dir

    kernel = cpu_linear.Kernel(cpu_linear.build(cache_dir() / "kernels"))
    torch.manual_seed(0)
    proj = [torch.randn(o, i) * 0.02 for _ in range(30) for o, i in LAYER]
    weights = proj + [torch.randn(*HEAD) * 0.02]
    mb = sum(w.numel() for w in weights) * 4 / 1e6
    print(f"one decode step's linear layers: {len(weights)} weights, {mb:.0f} MB fp32; torch threads "
          f"{torch.get_num_threads()}, kernel AVX{kernel.isa}, load average {os.getloadavg()[0]:.1f}")
    print(f"{'rows':>5} {'torch ms':>9} {'kernel ms':>10} {'ratio':>6} {'torch GB/s':>11} {'kernel GB/s':>12}")
    timed = measure(kernel.linear, weights, tuple(args.rows), args.repeats)  # as the engine's routes are timed
    for m, t, k in zip(timed.rows, timed.torch_ms, timed.kernel_ms):
        print(f"{m:>5} {t:>9.1f} {k:>10.1f} {t / k:>5.2f}x {mb / t:>11.1f} {mb / k:>12.1f}")


if __name__ == "__main__":
    main()
