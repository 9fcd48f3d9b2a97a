"""The adapter check the engine and the trainer share: what vLLM's /v1/load_lora_adapter refuses,
and what does not fit the base model, is refused before peft touches a model.

vLLM's loader (vllm/lora/lora_model.py from_local_checkpoint) refuses any tensor whose module
suffix is not one of the architecture's LoRA modules; for the families of wharf/core/families.py
those are listed there (vllm_lora_modules), for any other model every linear layer's suffix."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from wharf.core.errors import WharfError
from wharf.core.families import family_of
from wharf.core.layout import adapter_config, adapter_weights


class AdapterNotFound(WharfError):
    """vLLM's LoRAAdapterNotFoundError: answered 404."""

    def __init__(self, name: str, path: str):
        super().__init__(f"Loading lora {name} failed: No adapter found for {path}")


class AdapterInvalid(WharfError):
    """Any other load failure: vLLM answers these with a 500."""


def check_adapter(name: str, path: str, base_model) -> None:
    """Refuse what vLLM's /v1/load_lora_adapter refuses (a missing dir: 404; bias, DoRA, a bad
    config: 500) and what does not fit the base model."""
    d = Path(path)
    cfg_path = adapter_config(d)
    if not d.is_dir() or not cfg_path.is_file():
        raise AdapterNotFound(name, path)
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise AdapterInvalid(f"Loading lora {name} failed: {cfg_path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("r"), int) or cfg["r"] < 1:
        raise AdapterInvalid(f"Loading lora {name} failed: {cfg_path}: 'r' must be a positive integer")
    if cfg.get("peft_type", "LORA") != "LORA":
        raise AdapterInvalid(f"Loading lora {name} failed: peft_type {cfg.get('peft_type')!r} is not LORA")
    if cfg.get("bias", "none") != "none":
        raise AdapterInvalid(f"Loading lora {name} failed: adapter bias is not supported")
    if cfg.get("use_dora"):
        raise AdapterInvalid(f"Loading lora {name} failed: DoRA adapters are not supported")
    weights = adapter_weights(d)
    if not weights.is_file():
        raise AdapterInvalid(f"Loading lora {name} failed: {weights} is missing")
    try:
        from safetensors.torch import load_file

        tensors = load_file(str(weights))
    except Exception as e:
        raise AdapterInvalid(f"Loading lora {name} failed: {weights}: cannot read ({e})") from None
    check_vllm_modules(name, path, tensors, base_model)
    modules = dict(base_model.named_modules())
    for key, t in tensors.items():
        if "lora_A" not in key and "lora_B" not in key:
            raise AdapterInvalid(f"Loading lora {name} failed: unexpected tensor {key!r} "
                                 "(modules_to_save and added vocabulary are not supported)")
        mod_path = module_of(key)
        mod = modules.get(mod_path)
        mod = getattr(mod, "base_layer", mod)  # already wrapped by peft for an earlier adapter
        if not isinstance(mod, torch.nn.Linear):
            raise AdapterInvalid(f"Loading lora {name} failed: {key!r} targets {mod_path!r}, "
                                 "which is not a linear layer of the base model")
        want = (cfg["r"], mod.in_features) if "lora_A" in key else (mod.out_features, cfg["r"])
        if tuple(t.shape) != want:
            raise AdapterInvalid(f"Loading lora {name} failed: {key!r} has shape {tuple(t.shape)}, "
                                 f"expected {want} for this base model")


def module_of(key: str) -> str:
    """base_model.model.<module path>.lora_A.weight -> <module path>"""
    return key.split(".lora_")[0].removeprefix("base_model.model.")


def check_vllm_modules(name: str, path: str, tensors: dict, base_model) -> None:
    """vLLM's check of the adapter's modules for a family it knows: each LoRA tensor's module
    suffix must be one its architecture loads LoRA into (its message, word for word in substance)."""
    fam = family_of(getattr(getattr(base_model, "config", None), "model_type", None))
    if fam is None:
        return  # any linear layer: the shape check below
    expected = fam.vllm_lora_modules()
    unexpected = sorted({module_of(k) for k in tensors if ("lora_A" in k or "lora_B" in k)
                         and module_of(k).rsplit(".", 1)[-1] not in expected})
    if unexpected:
        raise AdapterInvalid(f"Loading lora {name} failed: While loading {path}, expected target modules in "
                             f"{sorted(expected)} but received {unexpected[:4]}{' ...' if len(unexpected) > 4 else ''} "
                             f"({fam.name}: vLLM loads LoRA into its attention and MLP projections only)")
