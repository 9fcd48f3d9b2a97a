"""The GRPO/PPO loss and the sampled-token log-probs it needs, as pure tensor functions.

Shapes: B rows, T positions of a micro-batch, S = T - 1 scored positions (logits at t score the
token at t + 1), H hidden size, V vocabulary. Everything per position here is already shifted:
`targets[b, s] = input_ids[b, s + 1]`, masks and behaviour log-probs likewise.

`sampled_logprobs` never holds a [B, S, V] tensor: it walks the sequence in chunks, and its
backward needs no logits at all (the gradient of log p(y) with respect to the hidden state,
(W[y] - E_p[W]) / temperature, is a [B, S, H] tensor computed in the same forward pass).

The loss functions name each tensor's shape in its annotation: `Annotated[Tensor, "B S"]`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import torch
from torch import Tensor

AGGREGATIONS = ("token_mean", "seq_mean", "constant")
OBJECTIVES = ("grpo", "sft")
MISMATCH_MODES = ("tis", "mask", "none")
KL_CAP = 10.0  # the most one token's k3 estimate adds to the loss (x kl_coef)


class _SampledLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, temperatures: Tensor, chunk: int):
        w = weight.float()  # [V, H]
        need_grad = hidden.requires_grad
        logp = hidden.new_empty(targets.shape, dtype=torch.float32)  # [B, S]
        entropy = torch.empty_like(logp)
        grad_h = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device) if need_grad else None
        inv_t = 1.0 / temperatures.float()  # [B] per row, or [B, S] per position
        if inv_t.dim() == 1:
            inv_t = inv_t[:, None].expand(targets.shape)
        for s in range(0, targets.shape[1], chunk):
            h = hidden[:, s:s + chunk].float()  # [B, c, H]
            y = targets[:, s:s + chunk]  # [B, c]
            it = inv_t[:, s:s + chunk, None]  # [B, c, 1]
            z = (h @ w.T).mul_(it)  # [B, c, V], one chunk only
            lse = torch.logsumexp(z, dim=-1)  # [B, c]
            logp[:, s:s + chunk] = z.gather(-1, y[..., None]).squeeze(-1) - lse
            p = (z - lse[..., None]).exp_()  # softmax, reusing lse
            entropy[:, s:s + chunk] = lse - torch.einsum("bcv,bcv->bc", p, z)
            if need_grad:
                grad_h[:, s:s + chunk] = (w[y] - p @ w) * it  # d log p(y) / d h
            del z, p
        ctx.save_for_backward(grad_h)
        ctx.hidden_dtype = hidden.dtype
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp: Tensor, g_entropy: Tensor):
        (grad_h,) = ctx.saved_tensors
        if ctx.needs_input_grad[1]:
            raise RuntimeError("sampled_logprobs: the lm_head must be frozen (LoRA does not train it)")
        return (g_logp[..., None] * grad_h).to(ctx.hidden_dtype), None, None, None, None


def sampled_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, temperatures: Tensor,
                     chunk: int = 1024, keep: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(log p(targets), entropy), both [B, S] float32, of softmax(hidden @ weight.T / temperature).

    hidden [B, S, H] (any float dtype, differentiable), weight [V, H] the frozen lm_head,
    targets [B, S] int64, temperatures [B] (or [B, S]). The entropy is for metrics (no gradient).
    keep [B, S] (optional): score only these positions (the loss tokens) and give 0 elsewhere.
    A position's head costs about a quarter of the decoder's forward in SmolLM2-135M (28M of its
    134M parameters), and an agent's rows are mostly prompt and observations: most of it is saved.
    """
    if chunk < 1:
        raise ValueError(f"logprob chunk must be >= 1, got {chunk}")
    # float32 even under mixed precision: autocast would run the head's matmul in bf16 (log-prob
    # errors of ~0.04 on average, 0.16 at worst, against 1e-6 in float32)
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        if keep is None:
            return _SampledLogprobs.apply(hidden, weight, targets, temperatures, chunk)
        at = keep.bool().nonzero(as_tuple=True)  # the kept positions as one [1, N] row
        temps = temperatures[:, None].expand(targets.shape)[at][None]
        lp, ent = _SampledLogprobs.apply(hidden[at][None], weight, targets[at][None], temps, chunk)
        zero = torch.zeros(targets.shape, dtype=torch.float32, device=hidden.device)
        return zero.index_put(at, lp[0]), zero.index_put(at, ent[0])


def naive_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, temperatures: Tensor) -> Tensor:
    """The reference path: one full [B, S, V] float32 log-softmax (benchmarks and tests)."""
    z = (hidden.float() @ weight.float().T) / temperatures.float()[:, None, None]
    return torch.log_softmax(z, dim=-1).gather(-1, targets[..., None]).squeeze(-1)


@dataclass
class LossConfig:
    eps_low: float = 0.2
    eps_high: float = 0.28
    agg: str = "token_mean"  # token_mean | seq_mean | constant
    constant: float = 1.0  # the normaliser per rollout of `constant` (Dr. GRPO), fixed for the run
    kl_coef: float = 0.0
    mismatch: str = "tis"  # tis | mask | none
    mismatch_cap: float = 2.0
    mismatch_bound: float = 0.5
    objective: str = "grpo"  # grpo | sft (sft_loss: no ratio, no advantage, no behaviour log-probs)

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"train.objective={self.objective!r}: expected one of {', '.join(OBJECTIVES)}")
        if self.agg not in AGGREGATIONS:
            raise ValueError(f"train.loss_agg={self.agg!r}: expected one of {', '.join(AGGREGATIONS)}")
        if self.mismatch not in MISMATCH_MODES:
            raise ValueError(f"train.mismatch={self.mismatch!r}: expected one of {', '.join(MISMATCH_MODES)}")


@dataclass
class StepNorm:
    """Counts of the whole optimizer step (all micro-batches, all processes) the loss divides by.

    rollouts: the sum of the step's row weights (each row's share of its rollout's loss tokens),
    i.e. the number of rollouts whose tokens the step holds (fractional where a rollout's rows
    fall in several steps).
    """

    loss_tokens: float
    rollouts: float


def grpo_loss(logp: Annotated[Tensor, "B S"], behaviour: Annotated[Tensor, "B S"], mask: Annotated[Tensor, "B S"],
              advantages: Annotated[Tensor, "B"], weights: Annotated[Tensor, "B"], cfg: LossConfig, norm: StepNorm,
              prox: Annotated[Tensor, "B S"] | None = None,
              ref: Annotated[Tensor, "B S"] | None = None) -> tuple[Annotated[Tensor, ""], dict[str, Tensor]]:
    """This micro-batch's share of the step loss, and metric sums over its loss tokens.

    logp the trainer's log-probs (with gradient); behaviour the endpoint's stored log-probs; mask
    1 on loss tokens; weights each row's share of its rollout's loss tokens (wharf.batches: they
    sum to 1 over a rollout's rows). The aggregation makes a rollout's loss and per-token gradient
    independent of how its tokens are split into rows: token_mean weighs every loss token 1;
    seq_mean averages a rollout over its own loss tokens (weight / the row's tokens = 1 / the
    rollout's tokens); constant sums a rollout's tokens. The step divides by its loss tokens
    (token_mean) or its rollouts (seq_mean, x the constant). prox: the trainer's log-probs of the
    sampling policy (no gradient), needed by tis and mask: the PPO ratio is then taken to prox and
    the train/inference gap prox - behaviour is corrected separately; with mismatch none the ratio
    is taken to behaviour directly. ref: base-model log-probs for KL.
    Summing the returned loss over the step's micro-batches gives the step's loss.
    """
    mask = mask.float()
    w_tok = mask * _token_weights(mask, weights, cfg.agg)[:, None]
    old, is_w, w_tok = _mismatch_correction(logp, behaviour, prox, mask, w_tok, cfg)
    # off the mask the log-probs may be unscored (0) and behaviour any stored value: exp(0) there,
    # so that no inf * 0 turns the sum into NaN
    ratio = torch.exp((logp - old) * mask)
    a = advantages[:, None]
    clipped = ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high)
    per_tok = -torch.minimum(ratio * a, clipped * a) * is_w
    kl = None
    if ref is not None:
        # k3 (unbiased, >= 0) grows as exp(ref - logp): a token one step made 10+ nats less
        # likely than the reference gave k3 ~ 7e3 and a gradient norm of ~1e5, which the
        # gradient clip then spent on those few tokens. Bounded as verl and OpenRLHF bound it:
        # the log-ratio to +-20, the estimate to KL_CAP (no KL gradient from a token beyond it).
        d = ((ref - logp) * mask).clamp(-20.0, 20.0)
        kl = (torch.exp(d) - d - 1).clamp(max=KL_CAP)
        per_tok = per_tok + cfg.kl_coef * kl
    loss = _aggregate(per_tok, w_tok, mask, cfg, norm)
    with torch.no_grad():
        stats = _grpo_stats(ratio.detach(), a, mask, w_tok, kl, cfg)
        if cfg.mismatch == "tis":  # the importance weights of the sampling policy's gap (stale rows: larger)
            stats["is_weight"] = (is_w * mask).sum()
            stats["is_capped"] = ((prox - behaviour > math.log(cfg.mismatch_cap)).float() * mask).sum()
    return loss, stats


def _mismatch_correction(logp: Annotated[Tensor, "B S"], behaviour: Annotated[Tensor, "B S"],
                         prox: Annotated[Tensor, "B S"] | None, mask: Annotated[Tensor, "B S"],
                         w_tok: Annotated[Tensor, "B S"], cfg: LossConfig
                         ) -> tuple[Annotated[Tensor, "B S"], Annotated[Tensor, "B S"], Annotated[Tensor, "B S"]]:
    """(the log-probs the ratio is taken to, the importance weights, the token weights) after the
    train/inference gap prox - behaviour is corrected: tis weighs by exp(gap) capped, mask drops
    the rows whose mean |gap| is over the bound, none takes the ratio to behaviour directly."""
    is_w = torch.ones_like(logp)
    if cfg.mismatch == "none":
        return behaviour, is_w, w_tok
    if prox is None:
        raise ValueError(f"mismatch={cfg.mismatch} needs the recomputed log-probs of the sampling policy")
    gap = prox - behaviour  # log(pi_train / pi_infer) of the sampling policy
    if cfg.mismatch == "tis":
        is_w = torch.exp(gap).clamp(max=cfg.mismatch_cap)
    else:
        row_gap = (gap.abs() * mask).sum(1) / mask.sum(1).clamp(min=1)  # [B]
        w_tok = w_tok * (row_gap <= cfg.mismatch_bound).float()[:, None]
    return prox, is_w, w_tok


def _grpo_stats(r: Annotated[Tensor, "B S"], a: Annotated[Tensor, "B 1"], mask: Annotated[Tensor, "B S"],
                w_tok: Annotated[Tensor, "B S"], kl: Annotated[Tensor, "B S"] | None,
                cfg: LossConfig) -> dict[str, Tensor]:
    """Metric sums over the loss tokens: clipped tokens by side, the ratio, the KL, masked rows."""
    return {
        "tokens": mask.sum(),
        "clip_low": (((r < 1 - cfg.eps_low) & (a < 0)).float() * mask).sum(),
        "clip_high": (((r > 1 + cfg.eps_high) & (a > 0)).float() * mask).sum(),
        "ratio": (r * mask).sum(),
        "kl": (kl.detach() * mask).sum() if kl is not None else torch.zeros(()),
        "masked_rows": ((w_tok.sum(1) == 0) & (mask.sum(1) > 0)).float().sum(),
    }


def sft_loss(logp: Tensor, mask: Tensor, norm: StepNorm) -> tuple[Tensor, dict[str, Tensor]]:
    """This micro-batch's share of the step's mean token NLL, and metric sums over its loss tokens.

    logp [B, S] the trainer's log-probs (with gradient); mask [B, S] 1 on loss tokens (the
    demonstration's assistant tokens). Every loss token of the step weighs the same (the step
    divides by its loss tokens, as token_mean does): summing over the step's micro-batches gives
    -sum(log p) / loss_tokens. Advantages, weights and behaviour log-probs play no part. The
    metric keys are grpo_loss's (no ratio: 1, no clipping, no KL) plus `nll`.
    """
    mask = mask.float()
    nll = -(logp * mask).sum()
    loss = nll / max(norm.loss_tokens, 1.0)
    with torch.no_grad():
        tokens = mask.sum()
        zero = torch.zeros((), dtype=torch.float32)
        stats = {"tokens": tokens, "clip_low": zero, "clip_high": zero, "ratio": tokens, "kl": zero,
                 "masked_rows": zero, "nll": nll.detach()}
    return loss, stats


def _token_weights(mask: Tensor, weights: Tensor, agg: str) -> Tensor:
    """[B] the weight of each loss token of a row (see grpo_loss)."""
    if agg == "seq_mean":  # share / row tokens = 1 / the rollout's loss tokens
        return weights / mask.sum(1).clamp(min=1)
    return torch.ones_like(weights)


def _aggregate(per_tok: Tensor, w_tok: Tensor, mask: Tensor, cfg: LossConfig, norm: StepNorm) -> Tensor:
    total = (per_tok * w_tok).sum()
    if cfg.agg == "token_mean":  # every loss token of the step counts the same
        return total / max(norm.loss_tokens, 1.0)
    if cfg.agg == "seq_mean":  # each rollout's mean over its own tokens, then the mean over rollouts
        return total / max(norm.rollouts, 1e-9)
    return total / (max(norm.rollouts, 1e-9) * cfg.constant)  # Dr. GRPO: token sum / constant, mean over rollouts


def mismatch_stats(prox: Tensor, behaviour: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Sum and max of |recomputed - stored| log-prob over loss tokens (the train/inference gap)."""
    d = (prox - behaviour).abs() * mask
    return {"sum": d.sum(), "max": d.max() if d.numel() else torch.zeros(()), "tokens": mask.sum()}
