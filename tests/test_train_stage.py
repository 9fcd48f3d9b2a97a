"""train_round on real micro-batches sampled from SmolLM2-135M: one step moves the log-probs the
right way, metrics and the adapter are what vLLM and the engine expect, bad input writes nothing."""
from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from wharf.core.layout import RunLayout
from wharf.core.batches import BatchFormatError
from wharf.train.model import AdapterError
from wharf.train.stage import TrainError, train_round

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from train_util import base, convert_path, run_config, sample_rows, write_round  # noqa: E402

ADV = [1.0, -1.0, 1.0, -1.0]


@pytest.fixture(scope="module")
def rows():
    return sample_rows(4, 10, 1.0, seed=0)


def mean_logp(adapter, rows, sign: float) -> float:
    """Mean per-token log-prob of the completions whose advantage has `sign` (naive recomputation)."""
    from peft import PeftModel

    model, _ = base()
    m = PeftModel.from_pretrained(model, str(adapter)) if adapter else model
    vals = []
    with torch.no_grad():
        for r, a in zip(rows, ADV):
            if a * sign <= 0:
                continue
            ids = torch.tensor([r["ids"]])
            lp = torch.log_softmax(m(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
            vals.append(lp[r["n_prompt"] - 1:].mean().item())
    if adapter:
        m.unload()
    return sum(vals) / len(vals)


def train_dir(cfg, k=0):
    return RunLayout.of(cfg.runs_dir, cfg.name).round(k).train


def test_one_step_raises_positive_and_lowers_negative_completions(tmp_path, rows):
    cfg = run_config(tmp_path, "train.lr=0.002", "train.publish=true")  # nothing answers at endpoint.url
    write_round(convert_path(cfg), rows, ADV, 1.0)
    result = train_round(cfg, progress=False)
    paths = train_dir(cfg)
    assert result.steps == 1 and result.skipped_steps == 0 and result.policy == cfg.policy(1)
    assert not result.published and "not published" in result.publish_message
    # On-policy data: the trainer's recomputation equals what was stored.
    assert result.mismatch_mean < 1e-4 and result.mismatch_max < 1e-3
    (m,) = [json.loads(x) for x in paths.metrics.read_text().splitlines()]
    for key in ("loss", "clip_low", "clip_high", "kl", "entropy", "grad_norm", "lr", "tokens_per_s", "mismatch_mean"):
        assert key in m
    assert m["entropy"] > 0 and m["grad_norm"] > 0
    cfg_json = json.loads((paths.adapter / "adapter_config.json").read_text())
    assert cfg_json["r"] == 4 and not cfg_json.get("modules_to_save")
    assert (paths.adapter / "adapter_model.safetensors").is_file()
    from wharf.core.adapters import check_adapter  # the engine's own (vLLM's) acceptance checks

    check_adapter("policy-v1", str(paths.adapter), base()[0])
    assert mean_logp(paths.adapter, rows, +1) > mean_logp(None, rows, +1)
    assert mean_logp(paths.adapter, rows, -1) < mean_logp(None, rows, -1)
    # A second call finds the round trained and does not train again.
    again = train_round(cfg, progress=False)
    assert again.steps == 1 and paths.metrics.read_text().count("\n") == 1
    # Round 1 continues from policy-v1 with the same rank and targets.
    cfg1 = run_config(tmp_path, "round=1", "train.lr=0.002")
    write_round(convert_path(cfg1, 1), rows[:2], ADV[:2], 1.0)
    assert train_round(cfg1, progress=False).policy == cfg1.policy(2)
    # ...and refuses policy-v1 at another rank, writing nothing.
    cfg2 = run_config(tmp_path, "round=1", "train.lora_rank=8")
    (train_dir(cfg2, 1).root / "result.json").unlink()
    with pytest.raises(AdapterError, match="rank 4"):
        train_round(cfg2, progress=False)


def no_train_dir(cfg, k=0):
    return not train_dir(cfg, k).root.exists()


@pytest.fixture
def small_round(tmp_path, rows):
    cfg = run_config(tmp_path)
    write_round(convert_path(cfg), rows[:2], ADV[:2], 1.0)
    return cfg


def test_micro_batches_of_another_layout_are_refused(tmp_path, small_round):
    from safetensors.torch import save_file

    f = convert_path(small_round) / "mb-0000.safetensors"
    save_file({"input_ids": torch.zeros(1, 4, dtype=torch.int64)}, str(f), metadata={"format": "other", "version": "9"})
    with pytest.raises(BatchFormatError, match="re-run convert"):
        train_round(small_round, progress=False)
    assert no_train_dir(small_round)
    (convert_path(small_round) / "index.json").write_text(json.dumps({"format": "x", "version": 1, "files": []}))
    with pytest.raises(BatchFormatError, match="index.json"):
        train_round(small_round, progress=False)
    assert no_train_dir(small_round)


@pytest.mark.parametrize("override,match", [
    ("train.lora_target_modules=[q_proj,nope_proj]", "no linear layer named 'nope_proj'"),
    ("train.lora_target_modules=[lm_head]", "not loadable by vLLM"),
])
def test_bad_lora_settings_are_refused(small_round, override, match):
    cfg = run_config(small_round.runs_dir, override)
    with pytest.raises(AdapterError, match=match):
        train_round(cfg, progress=False)
    assert no_train_dir(cfg)


def test_an_adapter_of_another_base_model_is_refused(tmp_path, small_round):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    other = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=100))
    lc = LoraConfig(r=4, lora_alpha=8, target_modules=list(small_round.train.lora_target_modules))
    prev = train_dir(small_round, 0).adapter
    get_peft_model(other, lc).save_pretrained(str(prev))
    cfg = run_config(tmp_path, "round=1")
    import shutil

    shutil.copytree(convert_path(small_round), convert_path(cfg, 1))
    with pytest.raises(AdapterError, match="shape"):
        train_round(cfg, progress=False)
    assert no_train_dir(cfg, 1)


def test_no_micro_batches_and_no_convert_step(tmp_path):
    cfg = run_config(tmp_path)  # train_round alone (no convert passed in) refuses, naming the fix
    with pytest.raises(TrainError, match="run convert"):
        train_round(cfg, progress=False)
    assert no_train_dir(cfg)


def test_round_one_needs_policy_v1(tmp_path, small_round):
    cfg = run_config(tmp_path, "round=1")
    import shutil

    shutil.copytree(convert_path(small_round), convert_path(cfg, 1))
    with pytest.raises(TrainError, match="train round 0 first"):
        train_round(cfg, progress=False)


@pytest.mark.gpu
def test_cuda_training(tmp_path, rows):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cfg = run_config(tmp_path, "train.device=cuda", "train.mixed_precision=bf16", "train.lr=0.002")
    write_round(convert_path(cfg), rows, ADV, 1.0)
    result = train_round(cfg, progress=False)
    assert result.steps == 1 and result.skipped_steps == 0
    assert result.mismatch_mean < 0.05  # bf16 autocast on the GPU vs the fp32 CPU sampling
    assert mean_logp(result.adapter, rows, +1) > mean_logp(None, rows, +1)


def test_trackers_log_every_step_across_rounds(tmp_path, rows, monkeypatch):
    """train.log_with=[tensorboard,mlflow,wandb]: one run in each tracker in the run dir, steps
    numbered on across rounds (round 1's first step follows round 0's last), each read back by its
    own library (tests/tracker_readers.py)."""
    import tracker_readers as read
    from wharf.core.tracking import MODULES

    names = [n for n in ("tensorboard", "mlflow", "wandb") if importlib.util.find_spec(MODULES[n])]
    if not names:
        pytest.skip("no tracker installed (pip install -e '.[track]')")
    for k in (0, 1):
        cfg = run_config(tmp_path, f"round={k}", f"train.log_with=[{','.join(names)}]", "train.rows_per_step=2")
        write_round(convert_path(cfg, k), rows[:2], ADV[:2], 1.0)
        assert train_round(cfg, progress=False).steps == 1
    root = RunLayout.of(tmp_path, "t").trackers
    lines = [json.loads(x) for k in (0, 1) for x in train_dir(cfg, k).metrics.read_text().splitlines()]
    want = [(i + 1, round(m["loss"], 6)) for i, m in enumerate(lines)]
    got = {}
    if "tensorboard" in names:
        got["tensorboard"] = read.tb_series(root, "t", "train/loss")
        tags = set(read.tensorboard(root, "t").Tags()["scalars"])
        assert {"train/kl", "train/clip_low", "train/grad_norm", "train/mismatch_mean"} <= tags
    if "mlflow" in names:
        got["mlflow"] = read.mlflow_series(root, "t", "train/loss", monkeypatch)
    if "wandb" in names:
        got["wandb"] = read.wandb_series(read.wandb_records(root), "train/loss", "step")
    for name, series in got.items():
        assert [s for s, _ in series] == [1, 2], name
        assert [v for _, v in series] == pytest.approx([v for _, v in want], rel=1e-5), name


def test_round_one_resumes_adamw_where_round_zero_left_it(tmp_path, rows):
    from safetensors.torch import load_file

    over = ("train.lr=0.002", "train.rows_per_step=1")  # 2 steps a round
    cfg = run_config(tmp_path, *over)
    write_round(convert_path(cfg), rows[:2], ADV[:2], 1.0, rows_per_file=1)
    train_round(cfg, progress=False)
    s0 = torch.load(train_dir(cfg).root / "optimizer.pt", weights_only=True)
    assert s0["steps"] == 2
    cfg1 = run_config(tmp_path, "round=1", *over)
    write_round(convert_path(cfg1, 1), rows[:2], [0.0, 0.0], 1.0, rows_per_file=1)  # advantages 0: every gradient is 0
    train_round(cfg1, progress=False)
    s1 = torch.load(train_dir(cfg1, 1).root / "optimizer.pt", weights_only=True)
    assert s1["steps"] == 4
    # By hand: two AdamW steps on zero gradients decay round 0's moments by beta1^2 and beta2^2.
    for i, st in s0["optimizer"]["state"].items():
        new = s1["optimizer"]["state"][i]
        assert float(new["step"]) == 4
        torch.testing.assert_close(new["exp_avg"], st["exp_avg"] * 0.9 ** 2)
        torch.testing.assert_close(new["exp_avg_sq"], st["exp_avg_sq"] * 0.999 ** 2)
    # the carried moments moved the adapter (a fresh AdamW on zero gradients would not have)
    a0 = load_file(str(train_dir(cfg).adapter / "adapter_model.safetensors"))
    a1 = load_file(str(train_dir(cfg1, 1).adapter / "adapter_model.safetensors"))
    assert any(not torch.equal(a0[k], a1[k]) for k in a0)


def test_another_lora_dropout_after_round_zero_is_refused(tmp_path, small_round):
    from peft import LoraConfig, get_peft_model

    from wharf.core.model_store import embedded_model_dir, load_model

    model, _ = load_model(embedded_model_dir(), "cpu", "float32")
    lc = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=list(small_round.train.lora_target_modules))
    get_peft_model(model, lc).save_pretrained(str(train_dir(small_round, 0).adapter))
    cfg = run_config(tmp_path, "round=1", "train.lora_dropout=0.1")
    import shutil

    shutil.copytree(convert_path(small_round), convert_path(cfg, 1))
    with pytest.raises(AdapterError, match="lora_dropout 0.0, but train.lora_dropout=0.1"):
        train_round(cfg, progress=False)
    assert no_train_dir(cfg, 1)


def test_a_rank_without_files_adds_nothing_to_the_metrics(small_round):
    # Under DDP a rank with no file in a step runs a zero-weight pass on another rank's file to
    # keep the all-reduce in step; its tokens, ratio, clip and entropy must not be counted.
    from dataclasses import dataclass

    from wharf.train.plan import Step, plan_steps
    from wharf.train.run import build
    from wharf.train.stage import load_batches, loss_config

    @dataclass(frozen=True)
    class NotMine(Step):
        def for_rank(self, rank, world):
            return ()

    index, batches = load_batches(convert_path(small_round))
    setup = build(small_round, None, batches, loss_config(small_round))
    (step,) = plan_steps(index, 0, 0, 1, 0)
    m = setup.trainer.step(NotMine(**step.__dict__), first=True)
    assert m["loss"] == 0 and m["loss_tokens"] == 0 and m["masked_rows"] == 0
    assert m["ratio_mean"] == m["entropy"] == m["clip_low"] == m["clip_high"] == m["mismatch_mean"] == 0
    assert m["grad_norm"] == 0


@pytest.mark.parametrize("round_", [0, 1])
def test_the_trainer_measures_its_update_as_the_loops_two_forward_measure_does(tmp_path, rows, round_):
    """shift.json from the trainer's held log-probs of the sampling policy (prox: step 0's own, then
    the recomputed ones of later steps) plus one forward, against train/shift.measure (two)."""
    from wharf.train.model import base_model_dir
    from wharf.train.shift import measure

    if round_:  # round 1 starts from policy-v1: pi_prev is an adapter, not the base model
        cfg0 = run_config(tmp_path, "train.lr=0.002")
        write_round(convert_path(cfg0), rows[:2], ADV[:2], 1.0)
        train_round(cfg0, progress=False)
    cfg = run_config(tmp_path, f"round={round_}", "train.lr=0.002", "train.rows_per_step=2")
    write_round(convert_path(cfg, round_), rows, ADV, 1.0)
    assert train_round(cfg, progress=False).steps == 2
    paths = train_dir(cfg, round_)
    got = json.loads(paths.shift.read_text())
    prev = train_dir(cfg, 0).adapter if round_ else None
    want = measure(convert_path(cfg, round_), base_model_dir(cfg), paths.adapter, prev)
    assert got["tokens"] == want["tokens"] > 0 and got["weight_delta"] == want["weight_delta"] > 0
    for key in ("delta_mean", "delta_max", "kl"):
        assert got[key] == pytest.approx(want[key], rel=1e-3, abs=1e-5), key
    assert got["delta_mean"] > 1e-3  # two steps at this lr move the log-probs: not 0 against 0


@pytest.fixture
def fresh_accelerate_state():
    """accelerate keeps one AcceleratorState a process (its mixed precision fixed at the first
    Accelerator): a test of another precision starts and leaves it unset."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_bf16_mixed_precision_loads_the_frozen_base_in_bf16_and_trains_fp32_lora(tmp_path, rows, fresh_accelerate_state):
    """train.mixed_precision=bf16 (base_dtype auto): the base weights are held in bf16 (half of a
    float32 copy's memory), the LoRA weights and the saved adapter in float32, and the step still
    moves the policy the right way."""
    from safetensors.torch import load_file

    from wharf.train.model import load_policy

    cfg = run_config(tmp_path, "train.device=cpu", "train.mixed_precision=bf16", "train.lr=0.002")
    assert cfg.train.base_torch_dtype == "bfloat16"
    model, _ = load_policy(cfg, None)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.float32}
    assert {d for n, d in dtypes.items() if "lora_" not in n} == {torch.bfloat16}
    del model
    write_round(convert_path(cfg), rows, ADV, 1.0)
    result = train_round(cfg, progress=False)
    assert result.steps == 1 and result.skipped_steps == 0
    assert result.mismatch_mean < 0.05  # bf16 weights against the fp32 sampling
    saved = load_file(f"{result.adapter}/adapter_model.safetensors")
    assert saved and {t.dtype for t in saved.values()} == {torch.float32}
    assert mean_logp(result.adapter, rows, +1) > mean_logp(None, rows, +1)
    assert run_config(tmp_path, "train.mixed_precision=bf16", "train.base_dtype=float32").train.base_torch_dtype == "float32"
