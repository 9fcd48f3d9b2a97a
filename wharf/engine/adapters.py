"""LoRA adapters served at the base model's speed.

A forward pass whose rows all use one adapter runs on a merged weight set: for every linear
layer the adapter targets, a new tensor W + scale * B @ A, made when the adapter is loaded and
swapped into the module by reference (an attribute assignment per layer, no copy). At most
`max_merged` merged sets are kept (least recently used dropped, rebuilt when next needed: a few
seconds on 2 busy cores); each costs the size of the adapted layers' weights (~0.4 GB in fp32 for
SmolLM2-135M with all seven projections adapted, the trainer's default); with none kept
(`engine.merged_loras=0`) every adapter pass takes the hook path below.

A pass that mixes the base and adapters, or several adapters, runs on the base weights with
each adapter's low-rank update added to its own rows by forward hooks, as peft computes a
mixed batch. The base's weight tensors are never written: the base runs on them, put back by
reference. Every method runs on the batcher's thread, so nothing changes under a running pass.
"""
from __future__ import annotations

import json
import math
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from wharf.core.adapters import AdapterInvalid, check_adapter


@dataclass
class LoraWeights:
    scale: float
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]  # module path -> (A [r, in], B [out, r])


def read_adapter(name: str, path: str, modules: dict[str, torch.nn.Module]) -> LoraWeights:
    """A checked adapter dir's A/B pairs on the base's device and dtype, and peft's scale."""
    from safetensors.torch import load_file

    d = Path(path)
    cfg = json.loads((d / "adapter_config.json").read_text())
    for key in ("alpha_pattern", "rank_pattern"):
        if cfg.get(key):
            raise AdapterInvalid(f"Loading lora {name} failed: {d / 'adapter_config.json'}: "
                                 f"per-layer {key} is not supported; train with one rank and alpha")
    r, alpha = cfg["r"], cfg.get("lora_alpha", 8)  # peft's default alpha
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in load_file(str(d / "adapter_model.safetensors")).items():
        if not key.endswith(".weight"):
            raise AdapterInvalid(f"Loading lora {name} failed: {key!r} is not a LoRA weight "
                                 "(LoRA biases are not supported)")
        mod_path, _, rest = key.partition(".lora_")
        mod_path = mod_path.removeprefix("base_model.model.")
        halves.setdefault(mod_path, {})[rest[0]] = t
    pairs = {}
    for mod_path, h in halves.items():
        if set(h) != {"A", "B"}:
            raise AdapterInvalid(f"Loading lora {name} failed: {mod_path!r} has lora_{''.join(h)} "
                                 "but not both lora_A and lora_B")
        w = modules[mod_path].weight
        pairs[mod_path] = (h["A"].to(w.device, w.dtype), h["B"].to(w.device, w.dtype))
    return LoraWeights(scale, pairs)


def merged_weight(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """W + scale * B @ A as a new tensor (summed in fp32 at least); `w` is left as it was."""
    acc = torch.promote_types(w.dtype, torch.float32)
    return (w.to(acc) + scale * (b.to(acc) @ a.to(acc))).to(w.dtype)


class Adapters:
    def __init__(self, base_model, max_loras: int, max_merged: int = 2):
        self.base = base_model
        self.max_loras = max_loras
        self.max_merged = max_merged
        self.paths: dict[str, str] = {}
        self._lora: dict[str, LoraWeights] = {}
        self._merged: OrderedDict[str, dict[str, torch.nn.Parameter]] = OrderedDict()
        self._modules = {n: m for n, m in base_model.named_modules() if isinstance(m, torch.nn.Linear)}
        # The base's own weights, taken before any swap: what `_swap_in` puts back.
        self._base_w = {n: m.weight for n, m in self._modules.items()}
        self._swapped: set[str] = set()  # module paths now holding a merged weight
        self._hooks: list = []
        self._rows: list[tuple[LoraWeights, torch.Tensor]] = []  # the mixed pass's (adapter, row ids)
        self._current: object = None  # the selection in place: None (base), a name, or a tuple
        # Each load's number: with the name, the identity of the weights (prefix cache keys).
        self._loads: dict[str, int] = {}
        self._load_count = 0
        self.on_change = lambda name: None  # called after `name` is loaded, replaced or unloaded
        self.merged_passes = 0  # forward passes served on a merged weight set
        self.mixed_passes = 0  # ... and on the base weights with per-row hooks

    @property
    def merged(self) -> list[str]:
        """The adapters with a merged weight set kept, least recently used first."""
        return list(self._merged)

    def load(self, name: str, path: str, inplace: bool) -> None:
        check_adapter(name, path, self.base)
        if name not in self.paths and len(self.paths) >= self.max_loras:
            raise AdapterInvalid(f"Loading lora {name} failed: {len(self.paths)} adapters are loaded, "
                                 f"the limit is engine.max_loras={self.max_loras}; unload one first")
        try:
            weights = read_adapter(name, path, self._modules)
        except AdapterInvalid:
            raise
        except Exception as e:
            raise AdapterInvalid(f"Loading lora {name} failed: {type(e).__name__}: {e}") from None
        # Read in full before replacing: a failed load_inplace keeps the adapter it would replace.
        self._reset()
        self._merged.pop(name, None)
        self._lora[name], self.paths[name] = weights, path
        self._load_count += 1
        self._loads[name] = self._load_count
        self.on_change(name)
        if self.max_merged > 0:
            self._merged_set(name)  # now, while the load is awaited, not in the first batch's step

    def unload(self, name: str) -> None:
        self._reset()
        del self.paths[name], self._lora[name], self._loads[name]
        self._merged.pop(name, None)
        self.on_change(name)

    def identity(self, name: str | None):
        """What computed a KV under adapter `name` now: None for the base, else (name, load number)."""
        if name is None:
            return None
        n = self._loads.get(name)
        return ("not loaded", name) if n is None else (name, n)

    def select(self, adapters: list[str | None]):
        """Ready the model for a pass whose row i uses adapters[i] (None: the base); returns it."""
        names = set(adapters)
        if len(names) == 1 and (None in names or self.max_merged > 0):
            (name,) = names
            if name is not None:
                self.merged_passes += 1
            if name != self._current:
                self._clear_hooks()
                self._swap_in(self._merged_set(name) if name is not None else {})
                self._current = name
            return self.base
        self.mixed_passes += 1
        key = tuple(sorted(names - {None}))
        if key != self._current:
            self._clear_hooks()
            self._swap_in({})
            targets = set().union(*(self._lora[n].pairs for n in key))
            self._hooks = [self._modules[p].register_forward_hook(self._hook(p)) for p in sorted(targets)]
            self._current = key
        device = self._device()
        self._rows = [(self._lora[n], torch.tensor([i for i, a in enumerate(adapters) if a == n], device=device))
                      for n in key]
        return self.base

    # -- internals --------------------------------------------------------------------------------
    def _device(self) -> torch.device:
        return next(iter(self._base_w.values())).device

    def _merged_set(self, name: str) -> dict[str, torch.nn.Parameter]:
        if name in self._merged:
            self._merged.move_to_end(name)
            return self._merged[name]
        lw = self._lora[name]
        merged = {p: torch.nn.Parameter(merged_weight(self._base_w[p], a, b, lw.scale), requires_grad=False)
                  for p, (a, b) in lw.pairs.items()}
        if self.max_merged > 0:
            self._merged[name] = merged
            while len(self._merged) > self.max_merged:
                self._merged.popitem(last=False)
        return merged

    def _swap_in(self, weights: dict[str, torch.nn.Parameter]) -> None:
        for p in self._swapped - weights.keys():
            self._modules[p]._parameters["weight"] = self._base_w[p]
        for p, w in weights.items():
            self._modules[p]._parameters["weight"] = w
        self._swapped = set(weights)

    def _hook(self, path: str):
        def add_lora(module, args, out):
            x = args[0]
            for lw, rows in self._rows:
                pair = lw.pairs.get(path)
                if pair is not None:
                    a, b = pair
                    out.index_add_(0, rows, (x.index_select(0, rows) @ a.T) @ b.T, alpha=lw.scale)
            return out
        return add_lora

    def _clear_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks, self._rows = [], []

    def _reset(self) -> None:
        """Back to the base weights with no hooks (before the adapter set changes)."""
        self._clear_hooks()
        self._swap_in({})
        self._current = None
