"""How far round k's training moved the policy, on the round's own loss tokens.

For every loss token of rounds/<k>/convert: d = log pi_new(token) - log pi_prev(token), pi_new the
adapter round k trained (policy-v<k+1>), pi_prev the policy that sampled the round (policy-v<k>;
round 0: the base model), both computed here by the same model code, so d is the update alone
(no train/inference mismatch in it). Written to rounds/<k>/train/shift.json: mean and max |d|,
the k3 estimate of KL(pi_prev || pi_new) (the tokens were sampled by pi_prev), and the largest
change of any adapter weight. The loop's health check 'policy_moved' reads it; the report shows it.
"""
from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import numpy as np

from wharf.batches import load_micro_batch, read_index
from wharf.layout import adapter_weights
from wharf import cpu_linear
from wharf.model_store import cache_dir, load_model

from .offpolicy import _logprobs, row_diffs


def shift_stats(diffs: list[np.ndarray]) -> dict:
    """Mean/max |d| and KL(pi_prev || pi_new) ~ mean(exp(d) - 1 - d) over all tokens (pure)."""
    d = np.concatenate([np.asarray(x, np.float64).ravel() for x in diffs]) if diffs else np.zeros(0)
    if not d.size:
        return {"tokens": 0, "delta_mean": 0.0, "delta_max": 0.0, "kl": 0.0}
    dc = np.clip(d, -20, 20)
    return {"tokens": int(d.size), "delta_mean": float(np.abs(d).mean()), "delta_max": float(np.abs(d).max()),
            "kl": float((np.exp(dc) - 1 - dc).mean())}


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
    cpu_kernel: the linear layers on wharf/cpu_linear.c."""
    from peft import PeftModel
    from safetensors.torch import load_file

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
    out = shift_stats(diffs)
    weights = load_file(str(adapter_weights(new)))
    before = load_file(str(adapter_weights(prev))) if prev is not None else None
    out["weight_delta"] = weight_delta(weights, before)
    return out


def write(out: Path, stats: dict) -> None:
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(stats, indent=1))
    os.replace(tmp, out)
