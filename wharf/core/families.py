"""The model families wharf serves and trains, in one table: what LoRA adapts, what vLLM's LoRA
loader accepts for that architecture, and the quirks of the family's chat template.

vLLM's side (read off its source: vllm/lora/utils.py get_supported_lora_modules,
vllm/lora/worker_manager.py, vllm/lora/lora_model.py from_local_checkpoint, and each model's
packed_modules_mapping in vllm/model_executor/models/): an adapter may target the suffix of any
of the model's vLLM linear layers, a packed layer (qkv_proj, gate_up_proj) by the names of the
layers packed into it; any other tensor in adapter_model.safetensors is refused ("expected target
modules in {...} but received [...]"). For Llama (which vLLM also runs Mistral as), Qwen2, Qwen3
and Gemma 2/3 the linear layers are qkv_proj, o_proj, gate_up_proj and down_proj, packed from
q/k/v_proj and gate/up_proj: the same seven names as the transformers layers LoRA wraps.
"""
from __future__ import annotations

from dataclasses import dataclass

from wharf.core.chat_template import ChatStyle

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
# vLLM's packed_modules_mapping of the dense decoder families below.
PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
DENSE_LINEAR = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # transformers' config.model_type
    attention: tuple[str, ...] = ATTENTION  # the projections LoRA adapts, by transformers' names
    mlp: tuple[str, ...] = MLP
    vllm_linear: tuple[str, ...] = DENSE_LINEAR  # the suffixes of vLLM's linear layers
    # The template knows only user and model turns (Gemma): tool results are sent as user turns,
    # consecutive ones joined, or it refuses the conversation.
    tool_results_as_user: bool = False
    # The tool-call format its chat template asks for when it renders tools, by vLLM's
    # --tool-call-parser name (the engine reads calls with it: wharf/engine/tool_parsers.py).
    tool_parser: str = "hermes"
    note: str = ""  # what differs from a Llama layer, for the engine's log
    refused: str = ""  # why wharf can neither serve nor train it (empty: it can)

    @property
    def targets(self) -> tuple[str, ...]:
        return self.attention + self.mlp

    def vllm_lora_modules(self) -> frozenset[str]:
        """What vLLM's loader accepts as an adapter's module suffix for this architecture."""
        return frozenset(n for m in self.vllm_linear for n in PACKED.get(m, (m,)))


FAMILIES = (
    Family("Llama", ("llama",), tool_parser="llama3_json"),  # Llama 2 and 3, SmolLM2
    Family("Mistral", ("mistral",), tool_parser="mistral", note="sliding-window attention where the config sets one"),
    Family("Qwen2.5", ("qwen2",), note="biases on q/k/v"),
    Family("Qwen3", ("qwen3",), note="RMS norms on q and k"),
    Family("Gemma 3", ("gemma3_text", "gemma3"), tool_results_as_user=True, tool_parser="pythonic",
           note="sandwich norms, scaled embeddings, gelu, sliding-window layers"),
    Family("Gemma 2", ("gemma2",), tool_results_as_user=True, tool_parser="pythonic", note="soft-capped logits",
           refused="its attention soft-caps logits, which transformers runs only in eager attention (the engine "
                   "and the trainer run sdpa), and its head soft-caps them, which the trainer's chunked log-probs "
                   "do not; wharf serves and trains Gemma 3"),
)
_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}


def family_of(model_type: str | None) -> Family | None:
    """The family of a transformers model_type; None for one this table does not list."""
    return _BY_TYPE.get(model_type or "")



def chat_style(config, generation_config, tokenizer) -> ChatStyle:
    """How wharf renders chats for this model: its family's template quirks, and the tokens that
    end an assistant turn (generation_config's eos ids, where the engine and vLLM stop)."""
    fam = family_of(getattr(config, "model_type", None))
    eos = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    ids = [] if eos is None else eos if isinstance(eos, list) else [eos]
    ends = tuple(t for t in tokenizer.convert_ids_to_tokens(ids) if t)
    return ChatStyle(tool_results_as_user=bool(fam and fam.tool_results_as_user), turn_ends=ends)


def refusal(config) -> str | None:
    """Why wharf cannot serve or train a model of this config, in one line (None: it can)."""
    fam = family_of(getattr(config, "model_type", None))
    if fam is not None and fam.refused:
        return f"{fam.name} (model_type {config.model_type!r}): {fam.refused}"
    if getattr(config, "attn_logit_softcapping", None):
        return (f"model_type {getattr(config, 'model_type', None)!r} soft-caps attention logits "
                "(attn_logit_softcapping), which transformers runs only in eager attention; the engine and the "
                "trainer run sdpa")
    return None


def sliding_window(config) -> int | None:
    """The attention window of the config's sliding-window layers (None: every layer sees the
    whole context). The local engine's attention masks are full-causal, so it serves such a
    model only up to this many tokens."""
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    types = getattr(config, "layer_types", None)
    if types is not None and "sliding_attention" not in types:
        return None
    return int(window)


def describe(config) -> str:
    """One line on the model's family, for the engine's and the trainer's logs."""
    mt = getattr(config, "model_type", None)
    fam = family_of(mt)
    if fam is None:
        return f"model_type {mt!r} (not in wharf/core/families.py: LoRA targets and vLLM's rules checked generically)"
    return f"{fam.name} (model_type {mt!r}{': ' + fam.note if fam.note else ''})"
