"""loop.init_adapter's wiring, without a live round: round 0 samples policy-v0, which the endpoint
is given from the init adapter before round 0 collects; the rows of round 0 are policy-v0's, and a
round with no signal carries the init adapter; the key's forms are checked at load."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from wharf.pipeline import loop
from wharf.pipeline.overlap import allowed_policies, check_lag
from testing.vllm_stub import StubServer
from wharf.core.config import ConfigError, load_config
from wharf.core.endpoint import Endpoint
from wharf.core.layout import RunLayout
from wharf.train.stage import train_round

sys.path.insert(0, str(Path(__file__).parent))
from train_util import adapter_tensors, convert_path, run_config, sample_rows, trained_adapter, write_round  # noqa: E402


def cfg_with(tmp_path: Path, *extra):
    return load_config(None, [f"runs_dir={tmp_path}", "name=warm", "endpoint.model=base-model", *extra])


def adapter(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "adapter_config.json").write_text(json.dumps({"r": 16, "peft_type": "LORA"}))
    return d


def test_round_0_samples_the_init_adapter_as_policy_v0(tmp_path, monkeypatch):
    start = adapter(tmp_path / "sft-run/rounds/2/train/adapter")
    cfg = cfg_with(tmp_path, f"loop.init_adapter={tmp_path / 'sft-run'}:3")
    v0 = cfg.policy(0)  # the run's own name for it on a shared fleet
    assert v0 == f"{cfg.layout.tag}-policy-v0" and loop.round_config(cfg, 0).collect.policy == v0
    assert loop.round_config(cfg, 1).collect.policy == cfg.policy(1) == f"{cfg.layout.tag}-policy-v1"
    published = []
    monkeypatch.setattr(loop, "publish", lambda c, path, name, resume: published.append((path, name)))
    with StubServer(loras=True) as replica:  # one replica, asked what it serves (/v1/models)
        ep = Endpoint(replica.url, model="base-model")
        loop.ensure_served(ep, cfg, 0)
        assert published == [(start, v0)]
        replica.stub.adapters[v0] = str(start)
        loop.ensure_served(ep, cfg, 0)  # served already: not again
        assert len(published) == 1
        replica.stub.adapters[v0] = "/other-run/adapter"  # another run serving this name
        loop.ensure_served(ep, cfg, 0)
        assert published == [(start, v0)] * 2
    # round 0's rows by policy-v0 are on-policy; the base model's would be another policy's
    assert allowed_policies(0, 0, cfg.start_policy) == (v0,)
    check_lag({v0: 3}, 0, 0, cfg.start_policy, "index.json")
    with pytest.raises(Exception, match="base-model"):
        check_lag({"base-model": 3}, 0, 0, cfg.start_policy, "index.json")


def test_without_init_adapter_round_0_is_the_base(tmp_path, monkeypatch):
    cfg = cfg_with(tmp_path)
    assert loop.round_config(cfg, 0).collect.policy == "base-model" == cfg.start_policy
    monkeypatch.setattr(loop, "publish", lambda *a, **k: pytest.fail("nothing to publish for round 0"))
    loop.ensure_served(Endpoint("http://127.0.0.1:9", model="base-model"), cfg, 0)  # never asked


def test_a_round_0_without_signal_carries_the_init_adapter(tmp_path):
    from wharf.pipeline.stages import carry_policy

    start = adapter(tmp_path / "sft")
    cfg = loop.round_config(cfg_with(tmp_path, f"loop.init_adapter={start}"), 0)
    out = carry_policy(cfg)
    assert out["policy"] == cfg.policy(1) and (Path(out["adapter"]) / "adapter_config.json").read_text() == \
        (start / "adapter_config.json").read_text()


@pytest.mark.parametrize("spec", ["base", "runs/x:0", "runs/x:"])
def test_init_adapter_forms_are_checked_at_load(tmp_path, spec):
    with pytest.raises(ConfigError, match="loop.init_adapter"):
        cfg_with(tmp_path, f"loop.init_adapter={spec}")


@pytest.mark.slow
def test_zero_advantage_rounds_leave_the_init_adapter_bit_for_bit(tmp_path):
    """The warm-start experiment's SFT-only arm (convert.advantage=zero from the SFT adapter) keeps
    policy-v0's weights in every round: kl_coef 0, weight_decay 0 and a fresh AdamW on zero
    gradients take no step. So its held-out score is the init adapter's, which every eval of the
    SFT+GRPO arm measures on the same trials (wharf/pipeline/loop.py: eval_stage)."""
    init = trained_adapter(tmp_path, "sft")
    zero = run_config(tmp_path, "name=zero", f"loop.init_adapter={tmp_path / 'sft'}:1", "train.epochs=2")
    write_round(convert_path(zero), sample_rows(4, 10, 1.0, seed=0), [0.0, 0.0, 0.0, 0.0], 1.0)
    out = train_round(zero, progress=False)
    assert out.steps > 0
    a, b = adapter_tensors(init), adapter_tensors(Path(out.adapter))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _first_kl(cfg) -> tuple[float, Path]:
    out = train_round(cfg, progress=False)
    metrics = RunLayout.of(cfg.runs_dir, cfg.name).round(0).train.metrics
    return json.loads(metrics.read_text().splitlines()[0])["kl"], Path(out.adapter)


@pytest.mark.slow
def test_kl_to_the_start_policy_holds_the_init_adapter_as_reference(tmp_path):
    """train.kl_ref=start: the KL's reference is the warm start's own adapter, so the first step,
    taken at the start policy, has KL 0 (against the base, the SFT adapter is far off); the
    reference stays frozen and out of the published adapter."""
    init = trained_adapter(tmp_path, "sft")
    kls = {}
    for ref in ("start", "base"):
        cfg = run_config(tmp_path, f"name=kl-{ref}", f"loop.init_adapter={tmp_path / 'sft'}:1", "train.kl_coef=0.5",
                         f"train.kl_ref={ref}", "train.epochs=1")
        write_round(convert_path(cfg), sample_rows(4, 10, 1.0, seed=0), [1.0, -1.0, 1.0, -1.0], 1.0)
        kls[ref], out = _first_kl(cfg)
        assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
        trained = adapter_tensors(out)
        assert trained.keys() == adapter_tensors(init).keys()
        assert any(not torch.equal(v, adapter_tensors(init)[k]) for k, v in trained.items()), "the policy took a step"
    assert kls["start"] < 1e-6 < kls["base"], kls
