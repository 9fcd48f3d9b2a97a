"""The optimizer-step loop on one round's micro-batches, through one accelerate `Accelerator`.

Each process takes its share of a step's files (files[rank::world]); gradients accumulate
locally (`no_sync`) and are all-reduced once, on the process's last micro-batch of the step.
Every micro-batch's loss is already divided by the counts of the *whole* step (see
loss.grpo_loss), and multiplied by the world size because DDP averages over processes.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import replace

import numpy as np
import torch

from wharf.core.batches import MicroBatch

from .loss import LossConfig, StepNorm, grpo_loss, mismatch_stats, sft_loss
from .plan import Step
from .shift import add_sums, diff_sums


def shifted(mb: MicroBatch) -> dict[str, torch.Tensor]:
    """The per-position tensors the loss uses, aligned with logits[:, :-1] (records.py's shift)."""
    return {"mask": mb.completion_mask[:, 1:], "behaviour": mb.old_logprobs[:, 1:]}


class Trainer:
    def __init__(self, accelerator, policy, peft_model, optimizer, scheduler, batches: list[MicroBatch],
                 loss_cfg: LossConfig, max_grad_norm: float, kl: bool, reference: str | None = None):
        self.acc = accelerator
        self.policy = policy  # PolicyLogprobs, prepared (DDP under launch)
        self.peft = peft_model
        self.opt = optimizer
        self.sched = scheduler
        self.batches = batches
        self.loss_cfg = loss_cfg
        self.max_grad_norm = max_grad_norm
        self.kl = kl
        self.reference = reference  # the KL's reference adapter; None: the base (adapter disabled)
        self.prox: dict[int, torch.Tensor] = {}
        # dropout: a training forward is not the sampling policy, so prox is always precomputed
        self.stochastic = any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in peft_model.modules())
        self.params = [p for p in peft_model.parameters() if p.requires_grad]

    @property
    def keeps_prox(self) -> bool:
        """Whether the round holds the sampling policy's recomputed log-probs (GRPO with a mismatch
        correction): what the correction reads, and what the update's measurement starts from."""
        return self.loss_cfg.objective != "sft" and self.loss_cfg.mismatch != "none"

    def logprobs(self, mb: MicroBatch, grad: bool, adapter: bool = True):
        module = self.policy if grad else self.acc.unwrap_model(self.policy)
        ctx = contextlib.ExitStack()
        if not grad:  # the sampling policy and the base model: no dropout, no graph
            ctx.enter_context(torch.no_grad())
            ctx.enter_context(_eval(self.peft))
        if not adapter:
            ctx.enter_context(self._reference())
        with ctx, self.acc.autocast():
            # only the loss tokens are scored: nothing reads a log-prob anywhere else
            return module(mb.input_ids, mb.attention_mask, mb.position_ids, mb.temperatures, mb.completion_mask[:, 1:])

    @contextlib.contextmanager
    def _reference(self):
        """The KL's reference policy active: the base, or the frozen start adapter (switching
        adapters freezes all; 'default' is made trainable again after)."""
        if self.reference is None:
            with self.peft.disable_adapter():
                yield
            return
        self.peft.set_adapter(self.reference, inference_mode=True)
        try:
            yield
        finally:
            self.peft.set_adapter("default")

    def compute_prox(self, files: list[int]) -> None:
        """The trainer's log-probs of the sampling policy (the adapter as loaded), before any update."""
        for i in files:
            if i not in self.prox:
                mb = self.batches[i].to(self.acc.device)
                self.prox[i] = self.logprobs(mb, grad=False)[0].detach()

    def shift_sums(self) -> np.ndarray | None:
        """shift.diff_sums of d = log pi_new - log pi_prev on every loss token of the round, all
        processes together: pi_prev the prox this process holds for each of its files (the sampling
        policy, before any update), pi_new the adapter now. None without prox (sft, mismatch=none)."""
        if not self.keeps_prox:
            return None
        sums = diff_sums([])
        for i in sorted(self.prox):
            mb = self.batches[i].to(self.acc.device)
            keep = mb.completion_mask[:, 1:] > 0
            d = (self.logprobs(mb, grad=False)[0] - self.prox[i])[keep]
            sums = add_sums(sums, diff_sums(d.double().cpu().numpy()))
        vec = torch.tensor(sums, dtype=torch.float64, device=self.acc.device)
        total = self.acc.reduce(vec.clone(), "sum")
        total[2] = self.acc.gather(vec[2:3]).max()
        return total.cpu().numpy()

    def step(self, step: Step, first: bool) -> dict:
        """One optimizer step; returns summed metrics (all processes) and whether it was skipped."""
        t0 = time.perf_counter()
        world, rank = self.acc.num_processes, self.acc.process_index
        mine = list(step.for_rank(rank, world))
        dummy = not mine  # this process has no file in the step: a zero-weight pass keeps DDP in step
        if dummy:
            mine = [step.files[0]]
        norm = StepNorm(loss_tokens=float(step.loss_tokens), rollouts=float(step.rollouts))
        sums: dict[str, torch.Tensor] = {}
        for j, i in enumerate(mine):
            mb = self.batches[i].to(self.acc.device)
            if dummy:  # no loss token: nothing of it enters the loss or the metrics
                mb = replace(mb, weights=torch.zeros_like(mb.weights), completion_mask=torch.zeros_like(mb.completion_mask))
            sync = j == len(mine) - 1
            with contextlib.nullcontext() if sync else self.acc.no_sync(self.policy):
                stats = self._micro(mb, i, norm, world, first, dummy)
            for k, v in stats.items():
                sums[k] = sums.get(k, 0) + v.detach().float()
        return self._finish(sums, t0, step)

    def _micro(self, mb: MicroBatch, i: int, norm: StepNorm, world: int, first: bool, dummy: bool) -> dict:
        s = shifted(mb)
        # before the graph is built: switching to the reference adapter toggles requires_grad
        ref = self.logprobs(mb, grad=False, adapter=False)[0] if self.kl and self.loss_cfg.objective != "sft" else None
        logp, entropy = self.logprobs(mb, grad=True)
        if self.loss_cfg.objective == "sft":  # no behaviour policy: nothing to recompute or correct
            loss, stats = sft_loss(logp, s["mask"], norm)
            self.acc.backward(loss * world)
            return {**stats, "loss": loss.detach(), "entropy": (entropy * s["mask"]).sum()}
        prox = self.prox.get(i)
        if dummy:
            prox = logp.detach()  # zero weights: any value will do
        elif prox is None and self.loss_cfg.mismatch != "none":
            if not first or self.stochastic:
                raise RuntimeError(f"micro-batch {i}: no recomputed log-probs of the sampling policy")
            prox = self.prox[i] = logp.detach()  # the first step runs at the sampling policy
        loss, stats = grpo_loss(logp, s["behaviour"], s["mask"], mb.advantages, mb.weights, self.loss_cfg,
                                norm, prox=prox, ref=ref)
        self.acc.backward(loss * world)
        stats = {**stats, "loss": loss.detach(), "entropy": (entropy * s["mask"]).sum()}
        if first:  # the train/inference gap at the sampling policy, before any update (every rank: same keys)
            mm = mismatch_stats(logp.detach() if prox is None else prox, s["behaviour"], s["mask"])
            stats.update(mismatch_sum=mm["sum"], mismatch_max=mm["max"], mismatch_tokens=mm["tokens"])
        return stats

    def _finish(self, sums: dict, t0: float, step: Step) -> dict:
        keys = sorted(sums)
        vec = self.acc.reduce(torch.stack([sums[k].to(self.acc.device) for k in keys]), "sum")
        tot = dict(zip(keys, vec.tolist()))
        if "mismatch_max" in sums:
            tot["mismatch_max"] = self.acc.gather(sums["mismatch_max"].reshape(1).to(self.acc.device)).max().item()
        norm = self._grad_norm()
        skipped = not (math.isfinite(norm) and math.isfinite(tot["loss"]))
        if skipped:
            self.opt.zero_grad(set_to_none=True)
        else:
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        lr = self.sched.get_last_lr()[0]
        self.sched.step()
        return _metrics(tot, norm, lr, skipped, time.perf_counter() - t0, step)

    def _grad_norm(self) -> float:
        if self.max_grad_norm > 0:
            return float(self.acc.clip_grad_norm_(self.params, self.max_grad_norm))
        grads = [p.grad.detach().float().norm() for p in self.params if p.grad is not None]
        return float(torch.stack(grads).norm()) if grads else 0.0


@contextlib.contextmanager
def _eval(module: torch.nn.Module):
    was = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was)


def _metrics(tot: dict, grad_norm: float, lr: float, skipped: bool, dt: float, step: Step) -> dict:
    n = max(tot.get("tokens", 0.0), 1.0)
    out = {"loss": tot["loss"], "clip_low": tot["clip_low"] / n, "clip_high": tot["clip_high"] / n,
           "ratio_mean": tot["ratio"] / n, "kl": tot["kl"] / n, "entropy": tot["entropy"] / n,
           "grad_norm": grad_norm, "lr": lr, "skipped": skipped, "loss_tokens": int(tot["tokens"]),
           "rows": step.rows, "masked_rows": int(tot["masked_rows"]), "step_s": round(dt, 3),
           "tokens_per_s": round(step.tokens / dt, 1) if dt > 0 else None}
    if "is_weight" in tot:  # train.mismatch=tis: mean importance weight, share of tokens at the cap
        out["is_weight_mean"], out["is_capped"] = tot["is_weight"] / n, tot["is_capped"] / n
    if "nll" in tot:  # train.objective=sft: the mean token NLL of the step's demonstrations
        out["nll"] = tot["nll"] / n
    if "mismatch_sum" in tot:
        out["mismatch_mean"] = tot["mismatch_sum"] / max(tot["mismatch_tokens"], 1.0)
        out["mismatch_max"] = tot["mismatch_max"]
    return out
