"""The trainer's frozen base weights on the C kernel (train.cpu_kernel) beside torch's matmul.

`python -m bench.train_kernel [--prompt 960 --completion 140 --rows 4] [--convert DIR]`

In LoRA training the base weights take no gradient, so every decoder projection needs x W^T
forward (twice with activation checkpointing) and dy W backward: wharf/cpu_linear.c does both
(torch's fp32 matmul here is MKL, slow on this AMD CPU). Timed alternately in one process (a load on
the machine slows both alike) on an agent's row shape, LoRA r16 on every projection and
activation checkpointing as train does:
- a GRPO micro-step: the reference's log-probs (no graph), then the policy's forward and backward;
- the update's measurement (train/shift.py): two forwards without a graph.
Rows are synthetic (`--prompt` tokens, then `--completion` loss tokens), or a stored round's
micro-batches with `--convert runs/<run>/rounds/<k>/convert`.
"""
from __future__ import annotations

from wharf import envdefaults

envdefaults.apply()  # before torch loads

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402


def kernel(peft, on: bool) -> None:
    """Route the model's linear layers through the kernel, or back to torch's nn.Linear."""
    from wharf import cpu_linear
    from wharf.model_store import cache_dir

    for m in peft.modules():
        if isinstance(m, torch.nn.Linear) and "forward" in m.__dict__:
            del m.forward
    if on and cpu_linear.install(peft, cache_dir() / "kernels", who="bench") is None:
        raise SystemExit("the C kernel cannot be built here (see the warning above)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.train_kernel", description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=960, help="prompt and observation tokens of a synthetic row")
    ap.add_argument("--completion", type=int, default=140, help="loss tokens of a synthetic row")
    ap.add_argument("--rows", type=int, default=4, help="synthetic rows (one micro-batch each)")
    ap.add_argument("--convert", type=Path, help="time a stored round's micro-batches instead")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    from bench.train import _model
    from bench.train_head import measurement, micro_step, stored, synthetic
    from train.model import PolicyLogprobs

    batches = stored(args.convert) if args.convert else synthetic(args.prompt, args.completion, args.rows)
    peft = _model("cpu", ckpt=True)
    policy = PolicyLogprobs(peft, 1024)
    tokens = sum(int(mb.attention_mask.sum()) for mb in batches)
    spent: dict[tuple[str, bool], float] = {}
    for rep in range(args.repeats):
        for on in ((False, True) if rep % 2 == 0 else (True, False)):
            kernel(peft, on)
            for name, fn in (("micro-step", lambda mb: micro_step(policy, peft, mb, True)),
                             ("measurement", lambda mb: measurement(peft, mb, True))):
                t0 = time.perf_counter()
                for mb in batches:
                    fn(mb)
                spent[name, on] = spent.get((name, on), 0.0) + time.perf_counter() - t0
    print(f"{len(batches)} micro-batches, {tokens} tokens, torch threads {torch.get_num_threads()}, "
          f"{args.repeats} repeats:")
    for name in ("micro-step", "measurement"):
        off, on = spent[name, False] / args.repeats, spent[name, True] / args.repeats
        print(f"  {name:<12} torch's matmul {off:6.1f} s   C kernel {on:6.1f} s   {off / on:.2f}x faster")


if __name__ == "__main__":
    main()
