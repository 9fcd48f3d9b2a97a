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


def synthetic(prompt: int, completion: int, rows: int) -> list:
    from wharf.batches import MicroBatch

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
    from wharf.batches import load_micro_batch, read_index

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
    """train/shift.py's two forwards of a micro-batch (new and previous policy), no graph."""
    from train.model import token_logprobs

    mask = mb.completion_mask[:, 1:] if keep else None
    causal = peft.get_base_model()
    with torch.no_grad():
        token_logprobs(causal, mb.input_ids, mb.attention_mask, mb.position_ids, mb.temperatures, 1024, mask)
        with peft.disable_adapter():
            token_logprobs(causal, mb.input_ids, mb.attention_mask, mb.position_ids, mb.temperatures, 1024, mask)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.train_head", description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=960, help="prompt and observation tokens of a synthetic row")
    ap.add_argument("--completion", type=int, default=140, help="loss tokens of a synthetic row")
    ap.add_argument("--rows", type=int, default=4, help="synthetic rows (one micro-batch each)")
    ap.add_argument("--convert", type=Path, help="time a stored round's micro-batches instead")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    from bench.train import _model
    from train.model import PolicyLogprobs

    batches = stored(args.convert) if args.convert else synthetic(args.prompt, args.completion, args.rows)
    peft = _model("cpu", ckpt=True)
    policy = PolicyLogprobs(peft, 1024)
    tokens = sum(int(mb.attention_mask.sum()) for mb in batches)
    loss = sum(int(mb.completion_mask.sum()) for mb in batches)
    spent: dict[tuple[str, bool], float] = {}
    for rep in range(args.repeats):
        for keep in ((False, True) if rep % 2 == 0 else (True, False)):
            for name, fn in (("micro-step", lambda mb: micro_step(policy, peft, mb, keep)),
                             ("measurement", lambda mb: measurement(peft, mb, keep))):
                t0 = time.perf_counter()
                for mb in batches:
                    fn(mb)
                spent[name, keep] = spent.get((name, keep), 0.0) + time.perf_counter() - t0
    print(f"{len(batches)} micro-batches, {tokens} tokens, {loss} loss tokens ({loss / tokens:.0%}), "
          f"torch threads {torch.get_num_threads()}, {args.repeats} repeats:")
    for name in ("micro-step", "measurement"):
        every, kept = spent[name, False] / args.repeats, spent[name, True] / args.repeats
        print(f"  {name:<12} every position {every:6.1f} s   loss tokens only {kept:6.1f} s   "
              f"{every / kept:.2f}x faster")


if __name__ == "__main__":
    main()
