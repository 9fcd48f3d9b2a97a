"""train.objective=sft: the loss against a hand computation, and a tiny real SFT round (LoRA on
SmolLM2-135M, the session's cached rows) that lowers the NLL of its own rows."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from wharf.train.loss import LossConfig, StepNorm, sft_loss
from wharf.train.stage import train_round

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


def test_grpo_refuses_supervised_rows(tmp_path):
    from wharf.core.batches import read_index, write_index
    from wharf.train.errors import TrainError

    cfg = run_config(tmp_path, "train.objective=grpo")
    write_round(convert_path(cfg), sample_rows(4, 10, 1.0, seed=0)[:2], [1.0, 1.0], 1.0)
    index = read_index(convert_path(cfg))
    index.mode = "sft"
    write_index(index, convert_path(cfg) / "index.json")
    with pytest.raises(TrainError, match="convert.mode=sft.*train.objective=grpo: train them with train.objective=sft"):
        train_round(cfg, progress=False)
    assert not (tmp_path / "t/rounds/0/train/adapter").exists()


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


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """Run `sft`, round 0: a 2-step SFT round on the cached rows (its adapter is policy-v1)."""
    tmp = tmp_path_factory.mktemp("runs")
    rows = sample_rows(4, 10, 1.0, seed=0)  # the same rows test_train_stage samples (session cache)
    cfg = run_config(tmp, "name=sft", "train.objective=sft", "train.lr=0.003", "train.rows_per_step=2")
    # advantages of both signs and zero behaviour log-probs: sft must ignore them all
    write_round(convert_path(cfg), [{**r, "lp": [0.0] * len(r["lp"])} for r in rows], [1.0, -1.0, 0.0, -2.0], 1.0)
    return tmp, rows, train_round(cfg, progress=False)


def test_a_tiny_sft_round_lowers_the_nll_of_its_rows(sft_run):
    _, rows, result = sft_run
    assert result.steps == 2 and result.skipped_steps == 0 and result.policy.endswith("-policy-v1")
    assert result.mismatch_mean is None  # no behaviour policy to compare with
    metrics = [json.loads(x) for x in (Path(result.adapter) / ".." / "metrics.jsonl").resolve().read_text().splitlines()]
    assert all(math.isfinite(m["nll"]) and m["nll"] > 0 and m["loss"] == pytest.approx(m["nll"], rel=1e-5)
               for m in metrics)
    before, after = nll(None, rows), nll(result.adapter, rows)
    assert after < before - 0.05, (before, after)


def lora_b(adapter) -> torch.Tensor:
    from safetensors.torch import load_file

    w = load_file(str(Path(adapter) / "adapter_model.safetensors"))
    return torch.cat([v.flatten() for k, v in sorted(w.items()) if "lora_B" in k])


def test_a_warm_started_round_0_continues_the_init_adapter(sft_run):
    tmp, rows, sft = sft_run
    # GRPO round 0 of another run, from the SFT run's policy-v1, with a step too small to move it
    cfg = run_config(tmp, "name=grpo", f"loop.init_adapter={tmp / 'sft'}:1", "train.lr=1e-9")
    assert cfg.start_policy == cfg.policy(0) == f"{cfg.layout.tag}-policy-v0"
    write_round(convert_path(cfg), rows, [1.0, -1.0, 1.0, -1.0], 1.0)
    result = train_round(cfg, progress=False)
    start, end = lora_b(sft.adapter), lora_b(result.adapter)
    assert start.abs().max() > 0  # a new LoRA starts with B = 0: this one continued the SFT adapter
    assert torch.allclose(start, end, atol=1e-6)


@pytest.mark.parametrize("override, message", [
    ("train.lora_rank=8", "rank 4, but train.lora_rank=8"),
    ("train.lora_target_modules=[q_proj]", "targets .* but train.lora_target_modules"),
])
def test_an_init_adapter_that_does_not_fit_is_refused_before_the_loop_starts(sft_run, override, message):
    from wharf.pipeline.loop import LoopError, check_init_adapter

    tmp, _, _ = sft_run
    cfg = run_config(tmp, "name=other", f"loop.init_adapter={tmp / 'sft'}:1", override)
    with pytest.raises(LoopError, match=f"loop.init_adapter=.*sft:1'.*rounds/0/train/adapter: {message}"):
        check_init_adapter(cfg)


def test_an_init_adapter_of_another_base_model_is_refused(sft_run, tmp_path):
    from wharf.pipeline.loop import LoopError, check_init_adapter
    from wharf.core.model_store import embedded_model_dir

    other = tmp_path / "SmolLM2-other"
    other.mkdir()
    (other / "config.json").write_text((embedded_model_dir() / "config.json").read_text())
    tmp, _, sft = sft_run
    # the run serves and trains `other` (one key: engine.model); the adapter was trained on the embedded model
    cfg = run_config(tmp, "name=other", f"loop.init_adapter={sft.adapter}", f"engine.model={other}")
    with pytest.raises(LoopError, match="base_model_name_or_path .* but this run trains .*SmolLM2-other"):
        check_init_adapter(cfg)
    missing = run_config(tmp, "name=other", f"loop.init_adapter={tmp / 'sft'}:7")
    with pytest.raises(LoopError, match="rounds/6/train/adapter holds no adapter"):
        check_init_adapter(missing)
