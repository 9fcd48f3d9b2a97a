"""train.loss against direct implementations of the formulas, written here token by token."""
from __future__ import annotations

import math

import pytest
import torch

from wharf.train.loss import LossConfig, StepNorm, grpo_loss, naive_logprobs, sampled_logprobs


def direct_loss(logp, behaviour, mask, adv, w, cfg: LossConfig, n_tokens, n_rollouts, prox=None, ref=None):
    """Plain Python loops over rows and tokens: the PPO clip objective, the corrections, the sums.
    w: each row's share of its rollout's loss tokens; token_mean does not use it."""
    B, S = len(logp), len(logp[0])
    total = 0.0
    for b in range(B):
        toks = [s for s in range(S) if mask[b][s] > 0]
        keep = 1.0
        if cfg.mismatch == "mask" and toks:
            gap = sum(abs(prox[b][s] - behaviour[b][s]) for s in toks) / len(toks)
            keep = 0.0 if gap > cfg.mismatch_bound else 1.0
        row = 0.0
        for s in toks:
            old = behaviour[b][s] if cfg.mismatch == "none" else prox[b][s]
            r = math.exp(logp[b][s] - old)
            rc = min(max(r, 1 - cfg.eps_low), 1 + cfg.eps_high)
            term = -min(r * adv[b], rc * adv[b])
            if cfg.mismatch == "tis":
                term *= min(math.exp(prox[b][s] - behaviour[b][s]), cfg.mismatch_cap)
            if ref is not None:
                term += cfg.kl_coef * (math.exp(ref[b][s] - logp[b][s]) - (ref[b][s] - logp[b][s]) - 1)
            row += term * keep
        if cfg.agg == "token_mean":
            total += row / n_tokens
        elif cfg.agg == "seq_mean":  # w / row tokens = 1 / the rollout's tokens
            total += (row * w[b] / max(len(toks), 1)) / n_rollouts
        else:
            total += row / (n_rollouts * cfg.constant)
    return total


def batch(seed=0, B=3, S=7):
    g = torch.Generator().manual_seed(seed)
    behaviour = -torch.rand(B, S, generator=g, dtype=torch.float64) * 3
    # the current policy strays both ways, far enough to hit both clip bounds
    logp = behaviour + (torch.rand(B, S, generator=g, dtype=torch.float64) - 0.5) * 1.2
    prox = behaviour + (torch.rand(B, S, generator=g, dtype=torch.float64) - 0.5) * 0.8
    ref = behaviour + (torch.rand(B, S, generator=g, dtype=torch.float64) - 0.5) * 0.5
    mask = (torch.rand(B, S, generator=g) > 0.3).double()
    mask[:, 0] = 1
    adv = torch.tensor([1.5, -0.7, 0.4], dtype=torch.float64)[:B]
    w = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)[:B]
    return logp, behaviour, prox, ref, mask, adv, w


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean", "constant"])
@pytest.mark.parametrize("mismatch", ["none", "tis", "mask"])
@pytest.mark.parametrize("kl", [0.0, 0.3])
def test_loss_matches_direct_formula(agg, mismatch, kl):
    logp, behaviour, prox, ref, mask, adv, w = batch()
    cfg = LossConfig(agg=agg, mismatch=mismatch, kl_coef=kl, constant=9.0, mismatch_cap=1.3, mismatch_bound=0.15)
    norm = StepNorm(loss_tokens=40.0, rollouts=5.0)  # the whole step is larger than this micro-batch
    got, _ = grpo_loss(logp, behaviour, mask, adv, w, cfg, norm, prox=prox, ref=ref if kl else None)
    L = lambda t: t.tolist()  # noqa: E731
    want = direct_loss(L(logp), L(behaviour), L(mask), L(adv), L(w), cfg, 40.0, 5.0, L(prox), L(ref) if kl else None)
    assert got.item() == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_the_mask_mode_drops_a_row_and_tis_caps():
    logp, behaviour, prox, _, mask, adv, w = batch()
    prox = behaviour.clone()
    prox[1] += 2.0  # row 1's recomputation strays far from what the endpoint stored
    norm = StepNorm(20.0, 3.0)
    masked, st = grpo_loss(logp, behaviour, mask, adv, w, LossConfig(mismatch="mask", mismatch_bound=0.5), norm, prox=prox)
    only = grpo_loss(logp[[0, 2]], behaviour[[0, 2]], mask[[0, 2]], adv[[0, 2]], w[[0, 2]],
                     LossConfig(mismatch="mask", mismatch_bound=0.5), norm, prox=prox[[0, 2]])[0]
    assert masked.item() == pytest.approx(only.item()) and st["masked_rows"].item() == 1
    capped = grpo_loss(logp, behaviour, mask, adv, w, LossConfig(mismatch="tis", mismatch_cap=2.0), norm, prox=prox)[0]
    huge = grpo_loss(logp, behaviour, mask, adv, w, LossConfig(mismatch="tis", mismatch_cap=1e9), norm, prox=prox)[0]
    assert capped.item() != pytest.approx(huge.item())  # exp(2) = 7.4 > cap 2 on row 1


def test_clip_fractions_and_gradient_stops_outside_the_clip():
    behaviour = torch.zeros(2, 3, dtype=torch.float64)
    logp = torch.log(torch.tensor([[0.5, 1.0, 1.5], [0.5, 1.0, 1.5]], dtype=torch.float64)).requires_grad_()
    mask = torch.ones(2, 3, dtype=torch.float64)
    adv = torch.tensor([-1.0, 1.0], dtype=torch.float64)
    loss, st = grpo_loss(logp, behaviour, mask, adv, torch.ones(2, dtype=torch.float64),
                         LossConfig(mismatch="none"), StepNorm(6.0, 2.0))
    assert st["clip_low"].item() == 1 and st["clip_high"].item() == 1  # r=0.5 with A<0; r=1.5 with A>0
    loss.backward()
    g = logp.grad
    assert g[0, 0] == 0 and g[1, 2] == 0  # clipped: no gradient
    assert g[0, 2] != 0 and g[1, 0] != 0  # the pessimistic branch keeps the unclipped term


def test_weights_and_padding_positions_do_not_leak():
    logp, behaviour, prox, _, mask, adv, w = batch()
    cfg, norm = LossConfig(mismatch="none", agg="seq_mean"), StepNorm(30.0, 3.0)
    base = grpo_loss(logp, behaviour, mask, adv, w, cfg, norm)[0]
    noisy = logp.clone()
    noisy[mask == 0] += 100.0  # anything off the mask is ignored
    assert grpo_loss(noisy, behaviour, mask, adv, w, cfg, norm)[0].item() == pytest.approx(base.item())
    w0 = w.clone()
    w0[0] = 0
    part = grpo_loss(logp[1:], behaviour[1:], mask[1:], adv[1:], w[1:], cfg, norm)[0]
    assert grpo_loss(logp, behaviour, mask, adv, w0, cfg, norm)[0].item() == pytest.approx(part.item())


@pytest.mark.parametrize("chunk", [1, 3, 5, 64])
def test_chunked_logprobs_equal_a_full_log_softmax(chunk):
    g = torch.Generator().manual_seed(1)
    B, S, H, V = 2, 11, 8, 50
    hidden = torch.randn(B, S, H, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64)
    targets = torch.randint(0, V, (B, S), generator=g)
    temps = torch.tensor([1.0, 0.6], dtype=torch.float64)
    got, ent = sampled_logprobs(hidden, weight, targets, temps, chunk)
    full = torch.log_softmax((hidden @ weight.T) / temps[:, None, None], -1)
    want = full.gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), -(full.exp() * full).sum(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(naive_logprobs(hidden, weight, targets, temps).double(), want, rtol=1e-5, atol=1e-5)
    coef = torch.randn(B, S, generator=g, dtype=torch.float64)
    (gh,) = torch.autograd.grad((got.double() * coef).sum(), hidden)
    (wh,) = torch.autograd.grad((want * coef).sum(), hidden)
    torch.testing.assert_close(gh, wh, rtol=1e-5, atol=1e-5)


def test_scoring_only_the_kept_positions_gives_the_same_values_and_gradient():
    g = torch.Generator().manual_seed(2)
    B, S, H, V = 3, 9, 8, 40
    hidden = torch.randn(B, S, H, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64)
    targets = torch.randint(0, V, (B, S), generator=g)
    temps = torch.tensor([1.0, 0.6, 0.8], dtype=torch.float64)
    keep = torch.rand(B, S, generator=g) > 0.6
    keep[2] = False  # a row without loss tokens
    full, full_ent = sampled_logprobs(hidden, weight, targets, temps, 4)
    got, ent = sampled_logprobs(hidden, weight, targets, temps, 4, keep=keep)
    assert keep.sum() > 3 and (got[~keep] == 0).all() and (ent[~keep] == 0).all()
    torch.testing.assert_close(got[keep].double(), full[keep].double(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ent[keep].double(), full_ent[keep].double(), rtol=1e-6, atol=1e-6)
    coef = torch.randn(B, S, generator=g, dtype=torch.float64) * keep
    (gk,) = torch.autograd.grad((got.double() * coef).sum(), hidden)
    (gf,) = torch.autograd.grad((full.double() * coef).sum(), hidden)
    torch.testing.assert_close(gk, gf, rtol=1e-6, atol=1e-6)
    assert gk[2].abs().max() == 0  # nothing kept, nothing flows
    none, _ = sampled_logprobs(hidden, weight, targets, temps, 4, keep=torch.zeros(B, S, dtype=torch.bool))
    assert none.shape == (B, S) and (none == 0).all()


def test_unscored_positions_off_the_mask_leave_the_loss_finite_and_unchanged():
    """Trainer log-probs are 0 off the mask; behaviour there may be anything stored (the -9999
    floor of a masked completion token): exp(0 - (-9999)) must not reach the sum as inf * 0."""
    logp, behaviour, prox, ref, mask, adv, w = batch()
    behaviour = behaviour.masked_fill(mask == 0, -9999.0)
    for mismatch in ("none", "tis", "mask"):
        cfg, norm = LossConfig(mismatch=mismatch, kl_coef=0.3), StepNorm(30.0, 3.0)
        want, st_w = grpo_loss(logp, behaviour, mask, adv, w, cfg, norm, prox=prox, ref=ref)
        z = lambda t: t * mask  # noqa: E731 -- what the trainer holds: 0 off the mask
        got, st = grpo_loss(z(logp), behaviour, mask, adv, w, cfg, norm, prox=z(prox), ref=z(ref))
        assert math.isfinite(got.item()) and got.item() == pytest.approx(want.item(), rel=1e-9)
        assert all(torch.isfinite(v).all() for v in st.values())
        assert st["ratio"].item() == pytest.approx(st_w["ratio"].item(), rel=1e-9)


def test_the_kl_estimate_is_bounded_per_token():
    """A token the update pushed far below the reference (d = ref - logp = 12 nats) adds at most
    KL_CAP and no KL gradient; one within the bound keeps k3 and its gradient 1 - exp(d)."""
    from wharf.train.loss import KL_CAP

    logp = torch.tensor([[-13.0, -3.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    mask, one = torch.ones(1, 2, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    cfg = LossConfig(mismatch="none", kl_coef=1.0)
    loss, st = grpo_loss(logp, logp.detach(), mask, torch.zeros(1, dtype=torch.float64), one, cfg,
                         StepNorm(1.0, 1.0), ref=ref)  # advantage 0: the loss is the KL alone
    assert st["kl"].item() == pytest.approx(KL_CAP + math.exp(2.0) - 2.0 - 1.0)
    loss.backward()
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(1.0 - math.exp(2.0))


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="loss_agg"):
        LossConfig(agg="mean")
    with pytest.raises(ValueError, match="mismatch"):
        LossConfig(mismatch="is")


def _split_rollouts(split: bool):
    """Rollout a (reward 1): 2 calls, 3 + 2 completion tokens, merged in one row or (a prefix break)
    split in two; rollout b (reward 0): 1 call, 4 tokens. rloo advantages: +1 and -1."""
    from pathlib import Path

    import numpy as np

    from wharf.convert.batching import pack
    from wharf.convert.build import build
    from wharf.convert.reader import Job
    from wharf.convert.rows import Call, RowOptions

    def call(turn, prompt, completion):
        return Call(turn, np.array(prompt, np.int32), np.array(completion, np.int32),
                    np.full(len(completion), -0.5, np.float32))

    second = [9, 2, 3, 4, 5, 6] if split else [1, 2, 3, 4, 5, 6]
    job = Job(Path("/j"), "j", "agent", [{"rollout_id": "a", "group_id": "g", "task_id": "t", "reward": 1.0,
                                           "status": "ok"},
                                          {"rollout_id": "b", "group_id": "g", "task_id": "t", "reward": 0.0,
                                           "status": "ok"}])
    job.calls = {"a": (0, [call(0, [1, 2], [3, 4, 5]), call(1, second, [7, 8])]), "b": (0, [call(0, [1, 2], [3, 4, 5, 6])])}
    job.turn_rows.update({"a": 2, "b": 1})
    out = build([job], RowOptions(), "rloo")
    assert len(out.rows) == (3 if split else 2)
    return pack(out.rows, 1, np.array(out.advantages), np.array(out.weights), np.array(out.rollout_index),
                np.array(out.group_index))


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean", "constant"])
def test_a_rollout_weighs_the_same_merged_or_split_into_rows(agg):
    # By hand, at ratio 1 every loss token's term is -A: 5 tokens of a (A = +1), 4 of b (A = -1).
    # token_mean: (-5 + 4) / 9, d/d logp = -A / 9; seq_mean: mean over rollouts of -A = 0,
    # d/d logp = -A / (rollout tokens x 2 rollouts); constant 10: (-5 + 4) / (10 x 2), -A / 20.
    want_loss = {"token_mean": -1 / 9, "seq_mean": 0.0, "constant": -1 / 20}[agg]
    want_grad = {"token_mean": (-1 / 9, 1 / 9), "seq_mean": (-1 / 10, 1 / 8), "constant": (-1 / 20, 1 / 20)}[agg]
    for split in (False, True):
        mb = _split_rollouts(split)
        mask, behaviour = mb.completion_mask[:, 1:].double(), mb.old_logprobs[:, 1:].double()
        logp = behaviour.clone().requires_grad_()
        norm = StepNorm(loss_tokens=float(mask.sum()), rollouts=float(mb.weights.sum()))
        assert norm.loss_tokens == 9 and norm.rollouts == pytest.approx(2.0)
        loss, _ = grpo_loss(logp, behaviour, mask, mb.advantages.double(), mb.weights.double(),
                            LossConfig(agg=agg, mismatch="none", constant=10.0), norm)
        loss.backward()
        assert loss.item() == pytest.approx(want_loss, abs=1e-7), split  # weights are stored float32
        for b in range(mb.shape[0]):
            toks = mask[b] > 0
            want = want_grad[0] if mb.advantages[b] > 0 else want_grad[1]
            torch.testing.assert_close(logp.grad[b][toks], torch.full((int(toks.sum()),), want, dtype=torch.float64),
                                       rtol=1e-6, atol=1e-7)


def test_the_dr_grpo_constant_is_the_generation_budget_fixed_for_the_run():
    from wharf.core.config import ConfigError, load_config
    from wharf.train.stage import loss_config

    cfg = load_config(None, ["train.loss_agg=constant", "sampling.max_tokens=40", "collect.agent_kwargs={max_turns: 3}"])
    assert loss_config(cfg).constant == 120.0  # 40 tokens x 3 turns, whatever the round's rows
    assert loss_config(load_config(None, ["train.loss_agg=constant", "train.loss_constant=7"])).constant == 7.0
    with pytest.raises(ConfigError, match="train.loss_constant"):  # no budget to take it from: refused at load
        load_config(None, ["train.loss_agg=constant", "sampling.max_tokens=40"])


def test_the_head_stays_float32_under_bf16_autocast():
    # accelerate's mixed_precision=bf16 runs the whole forward under autocast; the head must not follow
    g = torch.Generator().manual_seed(3)
    B, S, H, V = 2, 16, 64, 2000
    hidden = torch.randn(B, S, H, generator=g)
    weight = torch.randn(V, H, generator=g) * 0.3
    targets = torch.randint(0, V, (B, S), generator=g)
    temps = torch.tensor([1.0, 0.7])
    z = (hidden.double() @ weight.double().T) / temps.double()[:, None, None]
    want = torch.log_softmax(z, -1).gather(-1, targets[..., None]).squeeze(-1)  # float64 reference
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        got, _ = sampled_logprobs(hidden, weight, targets, temps, chunk=5)
    assert got.dtype == torch.float32
    assert (got.double() - want).abs().max().item() < 1e-4


def test_a_scaled_head_is_applied_and_a_soft_capped_one_refused():
    from peft import LoraConfig, get_peft_model

    from wharf.core.model_store import ModelError, embedded_model_dir, load_model
    from wharf.train.model import PolicyLogprobs

    model, _ = load_model(embedded_model_dir(), "cpu", "float32")
    ids = torch.tensor([[1, 504, 3145, 314, 260, 2567, 30, 2]])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].double()
    model.config.logit_scale = 2.0  # Cohere's: logits x 2
    peft = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    with torch.no_grad():
        got, _ = PolicyLogprobs(peft, chunk=3)(ids, torch.ones_like(ids), torch.arange(8)[None], torch.tensor([0.5]))
    want = torch.log_softmax(logits * 2.0 / 0.5, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    assert (got[0].double() - want).abs().max().item() < 1e-4
    model.config.logit_scale = None
    model.config.logits_scaling = 4.0  # Granite's: logits / 4
    with torch.no_grad():
        got, _ = PolicyLogprobs(peft, chunk=3)(ids, torch.ones_like(ids), torch.arange(8)[None], torch.tensor([1.0]))
    want = torch.log_softmax(logits / 4.0, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    assert (got[0].double() - want).abs().max().item() < 1e-4
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ModelError, match="final_logit_softcapping=30.0"):
        PolicyLogprobs(peft, chunk=3)
