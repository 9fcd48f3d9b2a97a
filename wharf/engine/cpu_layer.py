"""A decode step's decoder layers on a small C kernel: fewer torch operators, the same model.

A decode step of SmolLM2-135M runs ~6,500 torch operators (~210 a layer: norms, views, the
rotary embedding's slices and concatenations, the cache's bookkeeping, seven linear layers' own
dispatch); at one row their dispatch cost about what reading the weights did. cpu_layer.c does
the work around attention and the MLP's activation in three calls a layer, the linear layers on
wharf/core/cpu_linear.c; attention (sdpa with the batch's mask, the query heads packed onto their
KV head as transformers packs them) and silu stay on torch, so the arithmetic is the model's up
to float rounding (the kernel's sums run in another order).

It serves a pass only when it can do exactly what the model would: fp32 weights on the CPU, a
Llama-shaped model (its norms, rotary embedding, silu MLP, no biases), a batch whose cache is
made of kv.SlackLayers, and no forward hooks on the linear layers (the adapters' mixed passes
add LoRA through hooks); anything else returns None and the batcher runs the model.
"""
from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import torch

from wharf.core import cbuild, cpu_linear

from .kv import SlackLayer

log = logging.getLogger("wharf.engine")
SOURCE = Path(__file__).with_name("cpu_layer.c")
_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


def _bind(lib) -> None:
    lib.wharf_layer_qkv.argtypes = [_P] * 13 + [_I] * 7 + [_F, _I]
    lib.wharf_layer_mlp.argtypes = [_P] * 10 + [_I] * 4 + [_F, _I]
    lib.wharf_layer_down.argtypes = [_P] * 4 + [_I] * 4
    for fn in (lib.wharf_layer_qkv, lib.wharf_layer_mlp, lib.wharf_layer_down):
        fn.restype = None


# Families whose decoder layer is Llama's exactly (Mistral without a sliding window is).
LLAMA_SHAPED = ("llama", "mistral")


def llama_shaped(model) -> str | None:
    """Why this model's decoder layers are not what cpu_layer.c computes (None: they are)."""
    cfg = getattr(model, "config", None)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if cfg is None or layers is None or not hasattr(model, "lm_head"):
        return "not a decoder-only model with model.layers and lm_head"
    mt = getattr(cfg, "model_type", None)
    if mt not in LLAMA_SHAPED or getattr(cfg, "hidden_act", None) != "silu":
        return f"model_type {mt!r}, activation {getattr(cfg, 'hidden_act', None)!r}"
    if getattr(cfg, "sliding_window", None):  # Mistral v0.1's: a mask the kernel's decode does not apply
        return f"model_type {mt!r} with a sliding window of {cfg.sliding_window}"
    for layer in layers:
        a, mlp = layer.self_attn, layer.mlp
        linears = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if any(l.bias is not None for l in linears):
            return "biases in its linear layers"
    return None


class LayerKernel:
    """Callable as the batcher's `decode`: (model, ids [B, 1], mask4d [B, 1, 1, L], positions
    [B, 1], cache) -> logits [B, V], or None where the model must run the pass itself."""

    def __init__(self, path: Path, model):
        self.lib = ctypes.CDLL(str(path))
        _bind(self.lib)
        cfg = model.config
        self.hid, self.nh, self.nkv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
        self.d = getattr(cfg, "head_dim", None) or self.hid // self.nh
        self.inter = cfg.intermediate_size
        self.eps = float(cfg.rms_norm_eps)
        self.scale = self.d ** -0.5
        self.linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        self.steps = 0  # decode steps served here
        if not all(m.weight.dtype == torch.float32 and m.weight.device.type == "cpu" and m.weight.is_contiguous()
                   for m in self.linears):
            raise OSError("the linear layers' weights are not contiguous fp32 on the CPU")

    def usable(self, model, cache) -> bool:
        # The weights were checked at load; the adapters swap in merged weights of the same kind
        # (wharf/engine/adapters.py). Hooks come and go with the adapters' mixed passes: asked each step.
        return (len(cache.layers) == len(model.model.layers) and all(isinstance(l, SlackLayer) for l in cache.layers)
                and not any(m._forward_hooks or m._forward_pre_hooks for m in self.linears))

    def __call__(self, model, ids, mask4d, positions, cache) -> torch.Tensor | None:
        if ids.shape[1] != 1 or not self.usable(model, cache):
            return None
        inner, B = model.model, ids.shape[0]
        h = inner.embed_tokens(ids)[:, 0].contiguous()
        cos, sin = (t[:, 0].contiguous() for t in inner.rotary_emb(h[:, None], positions))
        qd, kd, g = self.nh * self.d, self.nkv * self.d, self.nh // self.nkv
        x, y = torch.empty(B, self.hid), torch.empty(B, self.hid)
        q, k, v = torch.empty(B, qd), torch.empty(B, kd), torch.empty(B, kd)
        gate, up = torch.empty(B, self.inter), torch.empty(B, self.inter)
        threads, ptr = torch.get_num_threads(), lambda t: t.data_ptr()
        with torch.profiler.record_function("wharf::cpu_layer"):  # its kind in bench.engine_profile
            for layer, kv in zip(inner.layers, cache.layers):
                a, mlp = layer.self_attn, layer.mlp
                col = kv.reserve()
                self.lib.wharf_layer_qkv(ptr(h), ptr(layer.input_layernorm.weight), ptr(a.q_proj.weight),
                                         ptr(a.k_proj.weight), ptr(a.v_proj.weight), ptr(cos), ptr(sin),
                                         ptr(kv._k), ptr(kv._v), ptr(q), ptr(x), ptr(k), ptr(v), B, self.hid,
                                         self.nh, self.nkv, self.d, kv._k.shape[2], col, self.eps, threads)
                att = torch.nn.functional.scaled_dot_product_attention(
                    q.view(B, self.nkv, g, self.d), kv.keys, kv.values, attn_mask=mask4d, scale=self.scale
                ).contiguous()
                self.lib.wharf_layer_mlp(ptr(h), ptr(att), ptr(a.o_proj.weight),
                                         ptr(layer.post_attention_layernorm.weight), ptr(mlp.gate_proj.weight),
                                         ptr(mlp.up_proj.weight), ptr(gate), ptr(up), ptr(x), ptr(y), B, self.hid,
                                         qd, self.inter, self.eps, threads)
                torch.nn.functional.silu(gate, inplace=True).mul_(up)
                self.lib.wharf_layer_down(ptr(h), ptr(gate), ptr(mlp.down_proj.weight), ptr(y), B, self.hid,
                                          self.inter, threads)
        self.steps += 1
        return model.lm_head(inner.norm(h))


def load(model, cache: Path) -> LayerKernel | None:
    """The kernel for `model`'s decode steps; None (and why, in the log) where it cannot serve them."""
    why = llama_shaped(model)
    if why is not None:
        log.info("engine: decode steps run transformers' own layers, not the C layer kernel (%s)", why)
        return None
    try:
        kernel = LayerKernel(cbuild.build(SOURCE, cache, cbuild.FLAGS, also=(cpu_linear.SOURCE,)), model)
    except OSError as e:
        log.warning("engine: decode steps run the model's own layers (the layer kernel is off: %s)", e)
        return None
    log.info("engine: decode steps on the layer kernel (attention and silu on torch)")
    return kernel
