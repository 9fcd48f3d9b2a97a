"""train.objective=sft: the loss against a hand computation, and a tiny real SFT round (LoRA on
SmolLM2-135M, the session's cached rows) that lowers the NLL of its own rows."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from train.loss import LossConfig, StepNorm, sft_loss
from train.stage import train_round

sys.path.insert(0, str(Path(__file__).parent))
from train_util import base, convert_path, run_config, sample_rows, write_round  # noqa: E402


def test_sft_loss_is_the_mean_token_nll_of_the_step():
    logp = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -3.0, -0.7]], requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    # the step holds these 3 loss tokens and 2 more in another micro-batch: 5 in all
    loss, stats = sft_loss(logp, mask, StepNorm(loss_tokens=5.0, rollouts=2.0))
    assert loss.item() == pytest.approx((1.0 + 2.0 + 0.1) / 5)
    assert stats["tokens"].item() == 3 and stats["nll"].item() == pytest.approx(3.1)
    loss.backward()  # d loss / d logp: -1 / step tokens on loss tokens, 0 elsewhere
    assert torch.equal(logp.grad, -mask / 5)


def test_sft_objective_is_checked():
    with pytest.raises(ValueError, match="train.objective='dpo'"):
        LossConfig(objective="dpo")


def nll(adapter, rows) -> float:
    """Mean token NLL of the rows' completions under the base model (+ adapter), recomputed naively."""
    from peft import PeftModel

    model, _ = base()
    m = PeftModel.from_pretrained(model, str(adapter)) if adapter else model
    total, n = 0.0, 0
    with torch.no_grad():
        for r in rows:
            ids = torch.tensor([r["ids"]])
            lp = torch.log_softmax(m(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
            total -= lp[r["n_prompt"] - 1:].sum().item()
            n += len(r["ids"]) - r["n_prompt"]
    if adapter:
        m.unload()
    return total / n


def test_a_tiny_sft_round_lowers_the_nll_of_its_rows(tmp_path):
    rows = sample_rows(4, 10, 1.0, seed=0)  # the same rows test_train_stage samples (session cache)
    cfg = run_config(tmp_path, "train.objective=sft", "train.lr=0.003", "train.rows_per_step=2")
    # advantages of both signs and zero behaviour log-probs: sft must ignore them all
    write_round(convert_path(cfg), [{**r, "lp": [0.0] * len(r["lp"])} for r in rows], [1.0, -1.0, 0.0, -2.0], 1.0)
    result = train_round(cfg, progress=False)
    assert result.steps == 2 and result.skipped_steps == 0 and result.policy == "policy-v1"
    assert result.mismatch_mean is None  # no behaviour policy to compare with
    metrics = [json.loads(x) for x in (Path(result.adapter) / ".." / "metrics.jsonl").resolve().read_text().splitlines()]
    assert all(math.isfinite(m["nll"]) and m["nll"] > 0 and m["loss"] == pytest.approx(m["nll"], rel=1e-5)
               for m in metrics)
    before, after = nll(None, rows), nll(result.adapter, rows)
    assert after < before - 0.05, (before, after)
