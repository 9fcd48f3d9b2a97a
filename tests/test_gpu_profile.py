"""configs/vllm.yaml, the GPU profile of the loop: vLLM and training share one GPU.

vLLM keeps `--gpu-memory-utilization` of the GPU for the whole loop; the trainer must fit in the
rest. The gpu test trains a round on CUDA with this process capped at exactly that rest.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from wharf.core.config import load_config

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))


def vllm_share(cfg) -> float:
    flags = [a for a in cfg.endpoint.vllm_args if a.startswith("--gpu-memory-utilization")]
    assert len(flags) == 1, "the GPU profile must cap vLLM's share of the GPU"
    return float(flags[0].split("=", 1)[1])


def test_gpu_profile_shares_one_gpu():
    cfg = load_config(REPO / "configs/vllm.yaml")
    assert 0.3 <= vllm_share(cfg) <= 0.8  # room for the trainer, and for vLLM's KV cache
    assert cfg.train.device == "cuda" and cfg.train.mixed_precision == "bf16"
    assert cfg.train.model == cfg.endpoint.model  # the trainer's base is the model vLLM serves
    assert "--enable-lora" in cfg.endpoint.vllm_args and f"--max-lora-rank={cfg.train.max_lora_rank}" in cfg.endpoint.vllm_args
    assert cfg.train.lora_rank <= cfg.train.max_lora_rank


def flag(cfg, name: str) -> str | None:
    """The value of vLLM flag `name` (--x=v) in endpoint.vllm_args, '' for a bare flag, None when absent."""
    for arg in cfg.endpoint.vllm_args:
        key, _, value = arg.partition("=")
        if key == name:
            return value
    return None


@pytest.mark.parametrize("name", ["gpu-shared", "gpu-split"])
def test_each_gpu_setup_loads_and_serves_what_it_trains(name):
    cfg = load_config(REPO / f"configs/{name}.yaml")
    assert cfg.name == name and cfg.endpoint.kind == "vllm"
    assert cfg.train.model == cfg.endpoint.model  # the trainer's base is the model vLLM serves
    assert cfg.train.device == "cuda" and cfg.train.mixed_precision == "bf16" and cfg.train.grad_checkpointing
    assert flag(cfg, "--enable-lora") == "" and flag(cfg, "--logprobs-mode") == "processed_logprobs"
    assert int(flag(cfg, "--max-lora-rank")) == cfg.train.max_lora_rank >= cfg.train.lora_rank
    assert int(flag(cfg, "--max-loras")) >= 2  # the policy sampling and the one being published
    share = float(flag(cfg, "--gpu-memory-utilization"))
    if name == "gpu-shared":  # vLLM started by the loop, on the GPU the trainer uses too
        assert cfg.endpoint.launch and share <= 0.5
    else:  # vLLM on GPUs of its own, started by the user (a launched one would share the loop's GPUs)
        assert not cfg.endpoint.launch and share >= 0.8 and int(flag(cfg, "--data-parallel-size")) >= 1
        text = (REPO / f"configs/{name}.yaml").read_text()
        assert f"--data-parallel-size {flag(cfg, '--data-parallel-size')}" in text  # the command it documents


@pytest.mark.gpu
def test_a_round_trains_in_the_memory_vllm_leaves(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from wharf.train.stage import train_round
    from train_util import convert_path, run_config, sample_rows, write_round

    share = vllm_share(load_config(REPO / "configs/vllm.yaml"))
    torch.cuda.set_per_process_memory_fraction(1.0 - share)
    torch.cuda.reset_peak_memory_stats()
    cfg = run_config(tmp_path, "train.device=cuda", "train.mixed_precision=bf16", "train.publish=false")
    write_round(convert_path(cfg), sample_rows(4, 10, 1.0, seed=0), [1.0, -1.0, 1.0, -1.0], 1.0)
    result = train_round(cfg, progress=False)
    assert result.steps == 1 and result.skipped_steps == 0
    peak = torch.cuda.max_memory_allocated()
    total = torch.cuda.get_device_properties(0).total_memory
    assert peak < (1.0 - share) * total
    print(f"peak {peak / 2**30:.2f} GiB of the {(1.0 - share) * total / 2**30:.1f} GiB vLLM leaves")
