"""The lm_head on the loss tokens only, beside every position scored, on an agent's row shape.

`python -m bench.train_head [--prompt 960 --completion 140 --rows 4] [--convert DIR]`

An agent's training row is mostly prompt and observations: a mini-swe-agent row of the warm-start
experiment holds ~1,100 tokens of which ~130 are the model's (its loss tokens). The trainer and
the update's measurement need log-probs at the loss tokens alone, so the head (28M of
SmolLM2-135M's 134M parameters, a [T, 49,152] matmul and softmax) runs there only
(`keep=` in train.loss.sampled_logprobs). Timed, alternately in one process (a load on the
machine slows both alike), with LoRA r16 on every projection and activation checkpointing as
train does:
- a GRPO micro-step: the reference's log-probs (no graph), then the policy's forward and backward;
- the update's measurement (wharf/train/shift.py): two forwards without a graph.
Rows are synthetic (`--prompt` tokens, then `--completion` loss tokens), or a stored round's
micro-batches with `--convert runs/<run>/rounds/<k>/convert`.
"""
from __future__ import annotations

from wharf.core import envdefaults

envdefaults.apply()  # before torch loads

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402


def synthetic(prompt: int, completion: int, rows: int) -> list:
    from wharf.core.batches import MicroBatch

    g, T = torch.Generator().manual_seed(0), prompt + completion
    out = []
    for i in range(rows):
        ids = torch.randint(3, 49152, (1, T), generator=g)
        cm = torch.zeros(1, T)
        cm[0, prompt:] = 1
        out.append(MicroBatch(ids, torch.ones_like(ids), torch.arange(T)[None], cm, torch.zeros(1, T),
                              torch.ones(1), torch.ones(1), torch.full((1,), 0.7), torch.tensor([i]), torch.tensor([0])))
    return out


def stored(convert: Path) -> list:
    from wharf.core.batches import load_micro_batch, read_index

    return [load_micro_batch(convert / f.file) for f in read_index(convert).files]


def micro_step(policy, peft, mb, keep: bool) -> None:
    """What train.trainer does per micro-batch under kl_coef > 0: reference, then policy with graph."""
    mask = mb.completion_mask[:, 1:] if keep else None
    args = (mb.input_ids, mb.attention_mask, mb.position_ids, mb.temperatures, mask)
    with torch.no_grad(), peft.disable_adapter():
        policy(*args)
    logp, _ = policy(*args)
    (logp * mb.completion_mask[:, 1:]).sum().backward()
    peft.zero_grad(set_to_none=True)


def measurement(peft, mb, keep: bool) -> None:
    """wharf/train/shift.py's two forwards of a micro-batch (new and previous policy), no graph."""
    from wharf.train.model import token_logprobs

    mask = mb.completion_mask[:, 1:] if keep else None
    causal = peft.get_base_model()
    with torch.no_grad():
        token_logprobs(causal, mb.input_ids, mb.attention_mask, mb.position_ids, mb.temperatures, 1024, mask)
        with peft.disable_adapter():
            token_logprobs(causal, mb.input_ids, mb.attention_mask, mb.position_ids, mb.temperatures, 1024, mask)


def row_args(prog: str, description: str, argv: list[str] | None, *flags: str) -> argparse.Namespace:
    """The row options this bench and bench.train_kernel share, and `flags` (store_true, no help)."""
    ap = argparse.ArgumentParser(prog=prog, description=description)
    for flag in flags:
        ap.add_argument(flag, action="store_true")
    ap.add_argument("--prompt", type=int, default=960, help="prompt and observation tokens of a synthetic row")
    ap.add_argument("--completion", type=int, default=140, help="loss tokens of a synthetic row")
    ap.add_argument("--rows", type=int, default=4, help="synthetic rows (one micro-batch each)")
    ap.add_argument("--convert", type=Path, help="time a stored round's micro-batches instead")
    ap.add_argument("--repeats", type=int, default=2)
    return ap.parse_args(argv)


def setup(args: argparse.Namespace) -> tuple:
    """(micro-batches, the peft model with LoRA r16 and checkpointing, its PolicyLogprobs, tokens)."""
    from bench.train import _model
    from wharf.train.model import PolicyLogprobs

    batches = stored(args.convert) if args.convert else synthetic(args.prompt, args.completion, args.rows)
    peft = _model("cpu", ckpt=True)
    return batches, peft, PolicyLogprobs(peft, 1024), sum(int(mb.attention_mask.sum()) for mb in batches)


def alternate(batches: list, repeats: int, switch, steps: dict) -> dict[tuple[str, bool], float]:
    """Seconds of each step (fn(micro-batch, variant) over every micro-batch) under the variants
    False and True in turn, switch(variant) first, the order reversed every other repeat (a load
    that drifts weighs on both alike); summed over the repeats."""
    spent: dict[tuple[str, bool], float] = {}
    for rep in range(repeats):
        for variant in ((False, True) if rep % 2 == 0 else (True, False)):
            switch(variant)
            for name, fn in steps.items():
                t0 = time.perf_counter()
                for mb in batches:
                    fn(mb, variant)
                spent[name, variant] = spent.get((name, variant), 0.0) + time.perf_counter() - t0
    return spent


def main(argv: list[str] | None = None) -> None:
    args = row_args("python -m bench.train_head", __doc__.splitlines()[0], argv)
    batches, peft, policy, tokens = setup(args)
    loss = sum(int(mb.completion_mask.sum()) for mb in batches)
    spent = alternate(batches, args.repeats, lambda keep: None,
                      {"micro-step": lambda mb, keep: micro_step(policy, peft, mb, keep),
                       "measurement": lambda mb, keep: measurement(peft, mb, keep)})
    print(f"{len(batches)} micro-batches, {tokens} tokens, {loss} loss tokens ({loss / tokens:.0%}), "
          f"torch threads {torch.get_num_threads()}, {args.repeats} repeats:")
    for name in ("micro-step", "measurement"):
        every, kept = spent[name, False] / args.repeats, spent[name, True] / args.repeats
        print(f"  {name:<12} every position {every:6.1f} s   loss tokens only {kept:6.1f} s   "
              f"{every / kept:.2f}x faster")


if __name__ == "__main__":
    main()
