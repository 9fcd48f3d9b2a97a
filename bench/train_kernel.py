"""The trainer's frozen base weights on the C kernel (train.cpu_kernel) beside torch's matmul.

`python -m bench.train_kernel [--prompt 960 --completion 140 --rows 4] [--convert DIR] [--everywhere]`

In LoRA training the base weights take no gradient, so every decoder projection needs x W^T
forward (twice with activation checkpointing) and dy W backward: wharf/core/cpu_linear.c does both
(torch's fp32 matmul here is MKL, slow on this AMD CPU). Timed alternately in one process (a load on
the machine slows both alike) on an agent's row shape, LoRA r16 on every projection and
activation checkpointing as train does:
- a GRPO micro-step: the reference's log-probs (no graph), then the policy's forward and backward;
- the update's measurement (wharf/train/shift.py): two forwards without a graph.
The kernel runs where wharf/core/cpu_routes.py timed it faster on this machine, as train runs it
(`--everywhere`: at every row count, the kernel alone against torch). Rows are synthetic
(`--prompt` tokens, then `--completion` loss tokens), or a stored round's micro-batches with
`--convert runs/<run>/rounds/<k>/convert`.
"""
from __future__ import annotations

from wharf.core import envdefaults

envdefaults.apply()  # before torch loads


import torch  # noqa: E402


def kernel(peft, on: bool, everywhere: bool) -> None:
    """Route the model's linear layers through the kernel, or back to torch's nn.Linear."""
    from wharf.core import cpu_linear
    from wharf.core.cpu_routes import Routes
    from wharf.core.model_store import cache_dir

    for m in peft.modules():
        if isinstance(m, torch.nn.Linear) and "forward" in m.__dict__:
            del m.forward
    routes = Routes.everywhere() if everywhere else None
    if on and cpu_linear.install(peft, cache_dir() / "kernels", who="bench", routes=routes) is None:
        raise SystemExit("the C kernel cannot be built here (see the warning above)")


def main(argv: list[str] | None = None) -> None:
    from bench.train_head import alternate, measurement, micro_step, row_args, setup

    args = row_args("python -m bench.train_kernel", __doc__.splitlines()[0], argv, "--everywhere")
    batches, peft, policy, tokens = setup(args)
    spent = alternate(batches, args.repeats, lambda on: kernel(peft, on, args.everywhere),
                      {"micro-step": lambda mb, on: micro_step(policy, peft, mb, True),
                       "measurement": lambda mb, on: measurement(peft, mb, True)})
    print(f"{len(batches)} micro-batches, {tokens} tokens, torch threads {torch.get_num_threads()}, "
          f"{args.repeats} repeats, the kernel {'at every row count' if args.everywhere else 'where timed faster here'}:")
    for name in ("micro-step", "measurement"):
        off, on = spent[name, False] / args.repeats, spent[name, True] / args.repeats
        print(f"  {name:<12} torch's matmul {off:6.1f} s   C kernel {on:6.1f} s   {off / on:.2f}x faster")


if __name__ == "__main__":
    main()
