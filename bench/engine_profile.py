"""`python -m bench.engine_profile [--batch 16 --context 100 --tokens 40]`: where a decode step of
the local engine spends its time, the profile to read before making the engine faster.

It drives the engine's batcher in process (no HTTP): `--batch` sequences of a `--context`-token
prompt, each generating `--tokens` tokens, and prints per decode step the wall time, the model's
forward pass and the rest (sampling, stop checks, cache bookkeeping), and, from torch's profiler,
the forward's operators by kind: the linear layers (weights read once a step), attention,
sampling noise, the layer kernel (wharf/engine/cpu_layer.py: the linear layers, norms and rotary
embedding of a decode step in C), everything else; and the same steps on the model's own layers,
side by side. It also prints the bytes of weights a step reads and the bandwidth that implies,
since at small batches a CPU decode step is bound by reading the weights.
The shares hold under load; the milliseconds do not (the load average is printed beside them).
"""
from __future__ import annotations

from wharf.core import envdefaults

envdefaults.apply()  # before torch loads

import argparse  # noqa: E402
import collections  # noqa: E402
import os  # noqa: E402

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # the profiler's own start/stop lines, not ours
import time  # noqa: E402

import torch  # noqa: E402

KINDS = {"wharf::cpu_linear": "linear layers", "aten::addmm": "linear layers", "aten::mm": "linear layers", "aten::linear": "linear layers",
         "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
         "aten::_scaled_dot_product_attention_math": "attention", "aten::exponential_": "sampling noise",
         "wharf::race": "sampling noise", "wharf::cpu_layer": "layer kernel"}


def sequences(core, batch: int, context: int, tokens: int) -> list:
    from wharf.engine.sequence import Sequence
    from wharf.engine.sampling import SamplingParams

    ids = core.tok("the quick brown fox " * context)["input_ids"][:context]
    params = [SamplingParams(temperature=0.7, max_tokens=tokens, ignore_eos=True, seed=i) for i in range(batch)]
    return [Sequence(list(ids), p, emit=lambda e: None) for p in params]


def decode_all(b) -> tuple[int, float, float]:
    """Decode steps until the batch is done: (steps, wall s, forward s)."""
    spent = [0.0]
    forward = b._forward

    def timed(*args, **kwargs):
        t = time.perf_counter()
        out = forward(*args, **kwargs)
        spent[0] += time.perf_counter() - t
        return out

    b._forward, steps, t0 = timed, b.steps, time.perf_counter()
    try:
        while b.running:
            b._decode_step()
    finally:
        del b._forward
    return b.steps - steps, time.perf_counter() - t0, spent[0]


def op_shares(b, seqs) -> dict[str, float]:
    """Self CPU time of the decode steps' operators, summed by kind (seconds)."""
    b._admit(seqs)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        while b.running:
            b._decode_step()
    out: dict[str, float] = collections.Counter()
    for e in prof.key_averages():
        out[KINDS.get(e.key, "other operators")] += e.self_cpu_time_total / 1e6
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.engine_profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=100, help="prompt tokens of every sequence")
    ap.add_argument("--tokens", type=int, default=40, help="tokens each sequence generates")
    ap.add_argument("--cpu-kernel", choices=["on", "off"], default="on",
                    help="engine.cpu_kernel: the linear layers on wharf/core/cpu_linear.c, decode steps on "
                         "wharf/engine/cpu_layer.c and the sampling race on "
                         "wharf/engine/cpu_race.c, or both on torch")
    args = ap.parse_args(argv)
    from wharf.engine.core import EngineCore
    from wharf.core.config import EngineConfig

    core = EngineCore(EngineConfig(prefix_cache=False, cpu_kernel=args.cpu_kernel == "on"))
    b = core.batcher
    torch.set_grad_enabled(False)
    b._admit(sequences(core, args.batch, args.context, 4))  # warm-up
    decode_all(b)
    b._admit(sequences(core, args.batch, args.context, args.tokens))
    steps, wall, fwd = decode_all(b)
    own = None
    if core.layer_kernel is not None:  # the same steps on the model's own layers
        b._decode = None
        b._admit(sequences(core, args.batch, args.context, args.tokens))
        own = decode_all(b)
        b._decode = core.layer_kernel
    ops = op_shares(b, sequences(core, args.batch, args.context, args.tokens))
    weights = sum(p.numel() * p.element_size() for p in b._model.parameters())
    ms = lambda s: 1000 * s / steps  # noqa: E731
    on = lambda k: "on" if k else "off"  # noqa: E731
    print(f"decode, {args.batch} sequences of {args.context} + {args.tokens} tokens, torch threads "
          f"{torch.get_num_threads()}, cpu kernels {on(core.cpu_kernel)} (linear) / {on(core.layer_kernel)} (layer) / "
          f"{on(core.race)} (race), load average {os.getloadavg()[0]:.1f}:")
    print(f"  step {ms(wall):.1f} ms ({args.batch * steps / wall:.1f} tok/s): forward {ms(fwd):.1f} ms "
          f"({fwd / wall:.0%}), sampling and bookkeeping {ms(wall - fwd):.1f} ms ({(wall - fwd) / wall:.0%})")
    if own is not None:
        print(f"  on the model's own layers instead of the layer kernel: step {1000 * own[1] / own[0]:.1f} ms "
              f"({own[1] / own[0] / (wall / steps):.2f}x the layer kernel's)")
    total = sum(ops.values())
    for kind, s in sorted(ops.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:<16} {s / total:6.1%} of operator time")
    # The layer kernel's time is mostly its linear layers (its norms and rotary are ~1% of the work).
    linear = (ops.get("linear layers", 0.0) + ops.get("layer kernel", 0.0)) / total * ms(wall) / 1000
    print(f"  weights read a step: {weights / 2**20:.0f} MiB; in the linear layers' share of a step that is "
          f"{weights / 2**30 / linear:.1f} GiB/s" if linear else "")


if __name__ == "__main__":
    main()
