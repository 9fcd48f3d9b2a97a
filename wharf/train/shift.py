"""How far round k's training moved the policy, on the round's own loss tokens.

For every loss token of rounds/<k>/convert: d = log pi_new(token) - log pi_prev(token), pi_new the
adapter round k trained (policy-v<k+1>), pi_prev the policy that sampled the round (policy-v<k>;
round 0: the base model), both computed here by the same model code, so d is the update alone
(no train/inference mismatch in it). Written to rounds/<k>/train/shift.json: mean and max |d|,
the k3 estimate of KL(pi_prev || pi_new) (the tokens were sampled by pi_prev), and the largest
change of any adapter weight. The loop's health check 'policy_moved' reads it; the report shows it.

The trainer writes it itself at the end of a GRPO round (Trainer.shift_sums): it already holds
log pi_prev of every loss token (the sampling policy's recomputed log-probs, `prox`), so one more
forward gives d, where `measure` below (the loop's fallback: SFT rounds, train.mismatch=none, a
round trained before this) loads the model again and runs two.
"""
from __future__ import annotations

import gc
from pathlib import Path

import numpy as np

from wharf.core import atomic
from wharf.core.batches import load_micro_batch, read_index
from wharf.core.layout import adapter_weights
from wharf.core import cpu_linear
from wharf.core.model_store import cache_dir, load_model

from .offpolicy import _logprobs, row_diffs


def diff_sums(d) -> np.ndarray:
    """[loss tokens, sum |d|, max |d|, sum of exp(d) - 1 - d] of log-prob differences d (pure): sums,
    so that the parts of a round (micro-batches, processes) add up."""
    d = np.asarray(d, np.float64).ravel()
    if not d.size:
        return np.zeros(4)
    dc = np.clip(d, -20, 20)
    return np.array([d.size, np.abs(d).sum(), np.abs(d).max(), (np.exp(dc) - 1 - dc).sum()])


def stats_of_sums(s) -> dict:
    """diff_sums' totals -> mean/max |d| and KL(pi_prev || pi_new) ~ mean(exp(d) - 1 - d) (pure)."""
    n = int(s[0])
    if not n:
        return {"tokens": 0, "delta_mean": 0.0, "delta_max": 0.0, "kl": 0.0}
    return {"tokens": n, "delta_mean": float(s[1] / n), "delta_max": float(s[2]), "kl": float(s[3] / n)}


def add_sums(a, b) -> np.ndarray:
    """Two parts' diff_sums as one (the max is a max)."""
    out = np.asarray(a, np.float64) + np.asarray(b, np.float64)
    out[2] = max(a[2], b[2])
    return out


def shift_stats(diffs: list[np.ndarray]) -> dict:
    """Mean/max |d| and the k3 KL over all tokens of the rows' differences (pure)."""
    d = np.concatenate([np.asarray(x, np.float64).ravel() for x in diffs]) if diffs else np.zeros(0)
    return stats_of_sums(diff_sums(d))


def weight_delta(new: dict, prev: dict | None) -> float:
    """Largest |change| of an adapter weight; round 0 (prev None) starts from lora_B = 0, so the
    change is the largest |lora_B| (lora_A alone changes nothing)."""
    if prev is None:
        return max((float(v.abs().max()) for k, v in new.items() if "lora_B" in k), default=0.0)
    out = 0.0
    for k, v in new.items():
        if k not in prev or prev[k].shape != v.shape:
            return float("inf")  # another adapter altogether
        out = max(out, float((v - prev[k]).abs().max()))
    return out


def measure(convert_dir: Path, model_dir: Path, new: Path, prev: Path | None, cpu_kernel: bool = False) -> dict:
    """Log-probs of the round's micro-batches under `new` and `prev` (None: the base model);
    cpu_kernel: the linear layers on wharf/core/cpu_linear.c."""
    from peft import PeftModel

    base, _ = load_model(model_dir, "cpu", "float32")
    if cpu_kernel:
        cpu_linear.install(base, cache_dir() / "kernels", who="train")
    model = PeftModel.from_pretrained(base, str(new), adapter_name="new").eval()
    if prev is not None:
        model.load_adapter(str(prev), adapter_name="prev")
    diffs = []
    for f in read_index(convert_dir).files:
        mb = load_micro_batch(Path(convert_dir) / f.file)
        model.set_adapter("new")
        lp_new = _logprobs(model, mb)
        if prev is None:
            with model.disable_adapter():
                lp_prev = _logprobs(model, mb)
        else:
            model.set_adapter("prev")
            lp_prev = _logprobs(model, mb)
        diffs += row_diffs(lp_new, lp_prev, mb.completion_mask[:, 1:].numpy())
    del model, base
    gc.collect()
    return {**shift_stats(diffs), "weight_delta": adapter_delta(new, prev)}


def adapter_delta(new: Path, prev: Path | None) -> float:
    """weight_delta of two adapter dirs (prev None: a new adapter)."""
    from safetensors.torch import load_file

    before = load_file(str(adapter_weights(prev))) if prev is not None else None
    return weight_delta(load_file(str(adapter_weights(new))), before)


def write(out: Path, stats: dict) -> None:
    atomic.write_json(out, stats)
