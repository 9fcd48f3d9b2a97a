"""LoRA adapters on one base model (peft multi-adapter), loaded and unloaded at runtime.

Every method here runs on the batcher's thread (between generation steps), so the model never
changes under a running forward pass. An adapter is checked before peft touches the model: a bad
one is refused with the model left as it was.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch


class AdapterNotFound(Exception):
    """vLLM's LoRAAdapterNotFoundError: answered 404."""

    def __init__(self, name: str, path: str):
        super().__init__(f"Loading lora {name} failed: No adapter found for {path}")


class AdapterInvalid(Exception):
    """Any other load failure: vLLM answers these with a 500."""


def check_adapter(name: str, path: str, base_model) -> None:
    """Refuse what vLLM's /v1/load_lora_adapter refuses (a missing dir: 404; bias, DoRA, a bad
    config: 500) and what does not fit the base model."""
    d = Path(path)
    cfg_path = d / "adapter_config.json"
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
    weights = d / "adapter_model.safetensors"
    if not weights.is_file():
        raise AdapterInvalid(f"Loading lora {name} failed: {weights} is missing")
    try:
        from safetensors.torch import load_file

        tensors = load_file(str(weights))
    except Exception as e:
        raise AdapterInvalid(f"Loading lora {name} failed: {weights}: cannot read ({e})") from None
    modules = dict(base_model.named_modules())
    for key, t in tensors.items():
        if "lora_A" not in key and "lora_B" not in key:
            raise AdapterInvalid(f"Loading lora {name} failed: unexpected tensor {key!r} "
                                 "(modules_to_save and added vocabulary are not supported)")
        # base_model.model.<module path>.lora_A.weight -> <module path>
        mod_path = key.split(".lora_")[0].removeprefix("base_model.model.")
        mod = modules.get(mod_path)
        mod = getattr(mod, "base_layer", mod)  # already wrapped by peft for an earlier adapter
        if not isinstance(mod, torch.nn.Linear):
            raise AdapterInvalid(f"Loading lora {name} failed: {key!r} targets {mod_path!r}, "
                                 "which is not a linear layer of the base model")
        want = (cfg["r"], mod.in_features) if "lora_A" in key else (mod.out_features, cfg["r"])
        if tuple(t.shape) != want:
            raise AdapterInvalid(f"Loading lora {name} failed: {key!r} has shape {tuple(t.shape)}, "
                                 f"expected {want} for this base model")


class Adapters:
    def __init__(self, base_model, max_loras: int):
        self.base = base_model
        self.peft = None
        self.paths: dict[str, str] = {}
        self.max_loras = max_loras

    @property
    def model(self):
        return self.peft if self.peft is not None else self.base

    def load(self, name: str, path: str, inplace: bool) -> None:
        from peft import PeftModel

        check_adapter(name, path, self.base)
        if name not in self.paths and len(self.paths) >= self.max_loras:
            raise AdapterInvalid(f"Loading lora {name} failed: {len(self.paths)} adapters are loaded, "
                                 f"the limit is engine.max_loras={self.max_loras}; unload one first")
        if name in self.paths:
            self.unload(name)
        try:
            if self.peft is None:
                self.peft = PeftModel.from_pretrained(self.base, path, adapter_name=name, is_trainable=False)
            else:
                self.peft.load_adapter(path, adapter_name=name, is_trainable=False)
        except Exception as e:
            raise AdapterInvalid(f"Loading lora {name} failed: {type(e).__name__}: {e}") from None
        self.peft.eval()
        self.paths[name] = path

    def unload(self, name: str) -> None:
        del self.paths[name]
        if not self.paths:
            # The last adapter: take the LoRA layers out again so the base runs at full speed.
            self.base = self.peft.unload()
            self.peft = None
        else:
            self.peft.delete_adapter(name)
