"""The policy: the endpoint's base model with a peft LoRA adapter that vLLM can load.

Round 0 starts a new adapter; round k continues from policy-v<k>, the adapter round k-1 trained.
Everything that would make an adapter vLLM refuses (a target that is not a linear layer of the
base, modules_to_save, a rank above the endpoint's limit) or that does not fit (another base
model, another rank) is refused here, before anything is written.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from wharf.core.adapters import AdapterInvalid, AdapterNotFound, check_adapter
from wharf.core.config import RunConfig
from wharf.core.errors import WharfError
from wharf.core.families import family_of
from wharf.core.layout import adapter_config
from wharf.core.model_identity import trained_model
from wharf.core.model_store import ModelError, load_model

from .loss import sampled_logprobs

# Layers vLLM's LoRA never loads: embeddings and the output head (its lm_head LoRA is gone).
REFUSED_TARGETS = ("lm_head", "embed_tokens")


class AdapterError(WharfError, ValueError):
    """An adapter config or dir that vLLM would refuse or that does not fit the base model."""


def base_model_dir(cfg: RunConfig) -> Path:
    """The served model, named by one key (wharf/core/model_identity.py: train.model when set and
    the same as the served one, else engine.model or endpoint.model)."""
    return trained_model(cfg).path


def check_lora_config(cfg: RunConfig, model: nn.Module) -> None:
    t = cfg.train  # rank and non-empty targets are checked when the config loads (wharf/core/config.py)
    linear = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    fam = family_of(getattr(model.config, "model_type", None))
    for target in t.lora_target_modules:
        if target in REFUSED_TARGETS:
            raise AdapterError(f"train.lora_target_modules: {target!r} is not loadable by vLLM's LoRA; "
                               "use attention/MLP projections only")
        if target not in linear:
            raise AdapterError(f"train.lora_target_modules: the base model has no linear layer named {target!r} "
                               f"(it has: {', '.join(sorted(linear - set(REFUSED_TARGETS)))})")
        if fam is not None and target not in fam.vllm_lora_modules():
            raise AdapterError(f"train.lora_target_modules: vLLM loads no LoRA into {target!r} of a {fam.name} model "
                               f"(it takes {', '.join(sorted(fam.vllm_lora_modules()))}; wharf/core/families.py)")


def check_adapter_dir(cfg: RunConfig, path: Path, model: nn.Module) -> None:
    """A previous round's (or loop.init_adapter's) adapter: readable, LoRA, this base model's shapes,
    and check_adapter_config's fields."""
    try:
        check_adapter(path.name, str(path), model)
    except (AdapterInvalid, AdapterNotFound) as e:
        raise AdapterError(f"{path}: {e}") from None
    check_adapter_config(cfg, path)


def check_adapter_config(cfg: RunConfig, path: Path) -> None:
    """What the adapter's adapter_config.json must share with this run's train section to be
    continued: rank, dropout, target modules, base model (named by its dir). No model is loaded:
    the loop checks loop.init_adapter with it before round 0 samples."""
    try:
        ac = json.loads(adapter_config(path).read_text())
    except (OSError, ValueError) as e:
        raise AdapterError(f"{path}: no readable adapter_config.json ({e})") from None
    if ac.get("modules_to_save"):
        raise AdapterError(f"{path}: modules_to_save={ac['modules_to_save']} (vLLM cannot load it)")
    if ac.get("r") != cfg.train.lora_rank:
        raise AdapterError(f"{path}: rank {ac.get('r')}, but train.lora_rank={cfg.train.lora_rank}; "
                           "continue with the same rank or start a new run")
    if float(ac.get("lora_dropout") or 0.0) != cfg.train.lora_dropout:
        raise AdapterError(f"{path}: lora_dropout {ac.get('lora_dropout')}, but train.lora_dropout="
                           f"{cfg.train.lora_dropout}: peft keeps the loaded layers' dropout, so the change would "
                           "only edit the saved config; use the same value or start a new run")
    targets = ac.get("target_modules") or []
    if sorted(targets) != sorted(cfg.train.lora_target_modules):
        raise AdapterError(f"{path}: targets {sorted(targets)}, but train.lora_target_modules="
                           f"{sorted(cfg.train.lora_target_modules)}; use the same targets")
    base, want = ac.get("base_model_name_or_path"), base_model_dir(cfg)
    if base and Path(base).name != want.name and Path(base).resolve() != want.resolve():
        raise AdapterError(f"{path}: base_model_name_or_path {base!r}, but this run trains {want} "
                           "(train.model, else the served model's key): an adapter continues only on the base it was trained on")


def head_scale(config) -> float:
    """What the model's own head multiplies its logits by (Cohere's logit_scale, Granite's 1 /
    logits_scaling); the chunked log-probs apply it through the temperature. A soft-capped head
    (Gemma 2's final_logit_softcapping) is refused: its log-probs would silently be wrong."""
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        raise ModelError(f"the base model's config sets final_logit_softcapping={cap}: the chunked log-probs "
                         "do not soft-cap logits; train another base model")
    scale = 1.0
    for key, power in (("logit_scale", 1), ("logits_scaling", -1)):
        v = getattr(config, key, None)
        if v is not None:
            if not isinstance(v, (int, float)) or v <= 0:
                raise ModelError(f"the base model's config sets {key}={v!r}: expected a positive number")
            scale *= float(v) ** power
    return scale


def load_policy(cfg: RunConfig, init_adapter: Path | None, device: str = "cpu"):
    """(peft model with the trainable adapter 'default', tokenizer). init_adapter None: a new one."""
    from peft import LoraConfig, PeftModel, get_peft_model

    model_dir = base_model_dir(cfg)
    try:
        base, tok = load_model(model_dir, device, cfg.train.base_torch_dtype)
    except ModelError:
        raise
    except Exception as e:  # transformers' own errors for broken dirs
        raise ModelError(f"{model_dir}: cannot load the base model ({type(e).__name__}: {e})") from None
    check_lora_config(cfg, base)
    head_scale(base.config)  # refuse a head the chunked log-probs cannot reproduce, before anything runs
    if init_adapter is not None:
        check_adapter_dir(cfg, init_adapter, base)
        model = PeftModel.from_pretrained(base, str(init_adapter), is_trainable=True)
    else:
        lc = LoraConfig(r=cfg.train.lora_rank, lora_alpha=cfg.train.lora_alpha,
                        lora_dropout=cfg.train.lora_dropout, target_modules=list(cfg.train.lora_target_modules),
                        bias="none", task_type="CAUSAL_LM")
        model = get_peft_model(base, lc)
    model.peft_config["default"].base_model_name_or_path = str(model_dir)
    if cfg.train.grad_checkpointing:
        enable_activation_checkpointing(base)
        base.enable_input_require_grads()
    base.config.use_cache = False
    model.train()
    return model, tok


REFERENCE = "reference"  # the frozen adapter of train.kl_ref=start, beside the trained 'default'


def load_reference(cfg: RunConfig, model, adapter: Path) -> None:
    """Hold `adapter` (the run's start policy) in `model` as a frozen second adapter, for the KL's
    reference log-probs; 'default' stays the active, trained one."""
    check_adapter_dir(cfg, adapter, model.get_base_model())
    model.load_adapter(str(adapter), adapter_name=REFERENCE, is_trainable=False)
    model.set_adapter("default")


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer in backward (transformers renamed the call in v5)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


class PolicyLogprobs(nn.Module):
    """The module accelerate wraps (DDP): batch in, sampled-token log-probs and entropy out.

    It calls the decoder for hidden states and scores them chunk by chunk against the frozen
    lm_head, so the [B, T, V] logits are never built (see loss.sampled_logprobs).
    """

    def __init__(self, peft_model: nn.Module, chunk: int):
        super().__init__()
        self.peft = peft_model
        self.chunk = chunk
        self.scale = head_scale(peft_model.get_base_model().config)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
                temperatures: Tensor, keep: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return token_logprobs(self.peft.get_base_model(), input_ids, attention_mask, position_ids,
                              temperatures / self.scale, self.chunk, keep)


def token_logprobs(causal_lm: nn.Module, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
                   temperatures: Tensor, chunk: int, keep: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """([B, T-1] log-probs of input_ids[:, 1:], entropy) under a causal LM (its adapters as set):
    the decoder for hidden states, then the frozen head chunk by chunk (loss.sampled_logprobs),
    only at `keep` [B, T-1] where given (0 elsewhere). temperatures [B] already divided by the
    head's scale (softmax(z * scale / T) = softmax(z / (T / scale)))."""
    hidden = causal_lm.model(input_ids=input_ids, attention_mask=attention_mask,
                             position_ids=position_ids, use_cache=False).last_hidden_state  # [B, T, H]
    head = causal_lm.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ModelError("lm_head with a bias is not supported by the chunked log-probs")
    return sampled_logprobs(hidden[:, :-1], head.weight, input_ids[:, 1:], temperatures, chunk, keep)


def save_adapter(peft_model: nn.Module, out: Path) -> None:
    """adapter_config.json + adapter_model.safetensors (peft's standard layout, what vLLM loads)."""
    # only the trained adapter: train.kl_ref=start holds a frozen reference beside it
    peft_model.save_pretrained(str(out), safe_serialization=True, selected_adapters=["default"])
    for extra in ("README.md",):
        (out / extra).unlink(missing_ok=True)


def lora_state(peft_model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in peft_model.named_parameters() if v.requires_grad}


def set_lora_state(peft_model: nn.Module, state: dict[str, Tensor]) -> None:
    params = dict(peft_model.named_parameters())
    with torch.no_grad():
        for k, v in state.items():
            params[k].copy_(v)
