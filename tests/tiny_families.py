"""Tiny random-weight models of the families people train, built here from each family's config
(hidden 64, 2 layers), each with a small BPE tokenizer trained on a few KB of text, the family's
special tokens, and a chat template written out from the family's documented turn format.

Nothing comes from a hub: the templates are ours, written to each family's published layout
(ChatML for Qwen, header blocks for Llama 3, turns for Gemma, [INST] blocks for Mistral), with
its tool format where the family's template has one.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024)

# ChatML, as Qwen2.5 writes it: tools in the system turn, calls as <tool_call> JSON, results
# grouped into one user turn of <tool_response> blocks.
QWEN25 = r"""{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif %}{{ '\n\n' }}# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>{% for tool in tools %}{{ '\n' }}{{ tool | tojson }}{% endfor %}{{ '\n' }}</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% else %}<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{% if message.content %}{{ message.content }}{% endif %}
{%- for tc in message.tool_calls or [] %}{% set f = tc.function if tc.function is defined else tc %}
{%- if message.content or not loop.first %}
{% endif %}<tool_call>
{"name": "{{ f.name }}", "arguments": {% if f.arguments is string %}{{ f.arguments }}{% else %}{{ f.arguments | tojson }}{% endif %}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}{{ '\n' }}<tool_response>
{{ message.content }}
</tool_response>
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>
{% endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Qwen3: ChatML as above; an assistant turn's reasoning sits in <think> blocks, and with
# enable_thinking=false the generation prompt opens and closes an empty one.
QWEN3 = QWEN25.replace("You are a helpful assistant.", "").replace(
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")

# Llama 3.1: header blocks, tools as JSON signatures in the first user turn, a call as a JSON
# object, results in the ipython role.
LLAMA3 = r"""{{- bos_token }}
{%- if messages[0].role == 'system' %}{% set system = messages[0].content %}{% set messages = messages[1:] %}{% else %}{% set system = '' %}{% endif %}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}{% if tools %}Environment: ipython
{% endif %}Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024

{{ system }}<|eot_id|>
{%- for message in messages %}
{%- if message.role == 'user' %}<|start_header_id|>user<|end_header_id|>

{% if tools and loop.first %}Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.

Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. Do not use variables.

{% for tool in tools %}{{ tool | tojson(indent=4) }}

{% endfor %}{% endif %}{{ message.content }}<|eot_id|>
{%- elif message.role == 'assistant' and message.tool_calls %}{% set f = message.tool_calls[0].function %}<|start_header_id|>assistant<|end_header_id|>

{"name": "{{ f.name }}", "parameters": {% if f.arguments is string %}{{ f.arguments }}{% else %}{{ f.arguments | tojson }}{% endif %}}<|eot_id|>
{%- elif message.role == 'assistant' %}<|start_header_id|>assistant<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- elif message.role in ['tool', 'ipython'] %}<|start_header_id|>ipython<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

# Gemma: user and model turns only, strictly alternating; a system message is prefixed to the
# first user turn. No tool format of its own.
GEMMA = r"""{{- bos_token }}
{%- if messages[0].role == 'system' %}{% set prefix = messages[0].content + '\n\n' %}{% set loop_messages = messages[1:] %}{% else %}{% set prefix = '' %}{% set loop_messages = messages %}{% endif %}
{%- for message in loop_messages %}
{%- if (message.role == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}
{%- set role = 'model' if message.role == 'assistant' else message.role %}<start_of_turn>{{ role }}
{{ (prefix if loop.first else '') + message.content | trim }}<end_of_turn>
{% endfor %}
{%- if add_generation_prompt %}<start_of_turn>model
{% endif %}"""

# Mistral (v0.3 tokenizer): [INST] blocks; the tools before the last user turn, the system
# message inside it; calls after [TOOL_CALLS], results in [TOOL_RESULTS].
MISTRAL = r"""{{- bos_token }}
{%- if messages[0].role == 'system' %}{% set system = messages[0].content %}{% set loop_messages = messages[1:] %}{% else %}{% set system = '' %}{% set loop_messages = messages %}{% endif %}
{%- set users = loop_messages | selectattr('role', 'equalto', 'user') | list %}
{%- for message in loop_messages %}
{%- if message.role == 'user' %}
{%- if tools and message == users[-1] %}[AVAILABLE_TOOLS] [{% for tool in tools %}{{ tool | tojson }}{% if not loop.last %}, {% endif %}{% endfor %}][/AVAILABLE_TOOLS]{% endif %}
{%- if message == users[-1] and system %}[INST] {{ system }}

{{ message.content }}[/INST]{% else %}[INST] {{ message.content }}[/INST]{% endif %}
{%- elif message.role == 'assistant' and message.tool_calls %}[TOOL_CALLS] [{% for tc in message.tool_calls %}{"name": "{{ tc.function.name }}", "arguments": {% if tc.function.arguments is string %}{{ tc.function.arguments }}{% else %}{{ tc.function.arguments | tojson }}{% endif %}}{% if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}
{%- elif message.role == 'assistant' %} {{ message.content }}{{ eos_token }}
{%- elif message.role == 'tool' %}[TOOL_RESULTS] {"content": {{ message.content | tojson }}}[/TOOL_RESULTS]
{%- endif %}
{%- endfor %}"""


@dataclass(frozen=True)
class Family:
    name: str
    config: str  # the transformers config class
    model: str  # the transformers causal-LM class
    template: str
    bos: str | None
    eos: str
    pad: str
    specials: tuple[str, ...]
    extra: dict = field(default_factory=dict)  # config fields of the family
    turn_end: str | None = None  # ends an assistant turn where that is not the eos (generation_config stops on both)


FAMILIES = {
    "qwen2.5": Family("qwen2.5", "Qwen2Config", "Qwen2ForCausalLM", QWEN25, None, "<|im_end|>", "<|endoftext|>",
                      ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"),
                      dict(tie_word_embeddings=True, rope_theta=1e6)),
    "qwen3": Family("qwen3", "Qwen3Config", "Qwen3ForCausalLM", QWEN3, None, "<|im_end|>", "<|endoftext|>",
                    ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>",
                     "</think>"), dict(head_dim=16, tie_word_embeddings=True, rope_theta=1e6)),
    "llama3": Family("llama3", "LlamaConfig", "LlamaForCausalLM", LLAMA3, "<|begin_of_text|>", "<|eot_id|>",
                     "<|end_of_text|>", ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                         "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"),
                     dict(rope_theta=5e5, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                        "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 256})),
    "gemma3": Family("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", GEMMA, "<bos>", "<eos>", "<pad>",
                     ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"),
                     dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=768,
                          layer_types=["sliding_attention", "full_attention"]), turn_end="<end_of_turn>"),
    "mistral": Family("mistral", "MistralConfig", "MistralForCausalLM", MISTRAL, "<s>", "</s>", "</s>",
                      ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                       "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"), dict(sliding_window=None)),
}

CORPUS = """def add(a, b):\n    return a + b\n\nclass Stack:\n    def push(self, x):\n        self.items.append(x)\n
The quick brown fox jumps over the lazy dog. Tests pass when the function returns the right value.
Run the command ls -la and read the file README.md, then fix the bug in parse_args().
{"name": "bash", "arguments": {"command": "pytest -q"}} You are a helpful assistant.
Name a colour. Red, green and blue are colours. Count from one to three: one, two, three.
café naïve über 東京 — “quoted” ‘text’ …\t tabs\tand  double  spaces\n\nnew paragraphs.
"""


def build_tokenizer(fam: Family, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(fam.specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS * 20], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=fam.bos, eos_token=fam.eos,
                                   pad_token=fam.pad, chat_template=fam.template)
    fast.save_pretrained(out)
    return fast


def build(name: str, out: Path, seed: int = 0, **overrides) -> Path:
    """A tiny `name` model with its tokenizer in `out` (created); returns `out`."""
    import transformers

    fam = FAMILIES[name]
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(fam, out)
    config_cls, model_cls = getattr(transformers, fam.config), getattr(transformers, fam.model)
    ids = {k: tok.convert_tokens_to_ids(v) for k, v in (("bos_token_id", fam.bos), ("eos_token_id", fam.eos),
                                                         ("pad_token_id", fam.pad)) if v}
    config = config_cls(**{**TINY, "vocab_size": len(tok), **ids, **fam.extra, **overrides})
    torch.manual_seed(seed)
    model = model_cls(config)
    with torch.no_grad():  # random weights of a readable spread: sampled text is not one token
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.05 if name == "gemma3" else 0.2)  # Gemma scales its embeddings by sqrt(hidden)
    stops = [ids["eos_token_id"]] + ([tok.convert_tokens_to_ids(fam.turn_end)] if fam.turn_end else [])
    model.generation_config.eos_token_id = stops if len(stops) > 1 else stops[0]
    model.save_pretrained(out, safe_serialization=True)
    return out


def scripted(name: str, out: Path, prompt: list[dict], tools: list[dict] | None, pieces: list[str]) -> Path:
    """A tiny `name` model (built into `out`) that answers `prompt` (any chat whose rendered prompt
    ends in the same token) with `pieces`, one token each (a piece the vocabulary lacks is added
    as a plain token), then its eos, greedily. Its layers add nothing (o_proj and down_proj zero),
    so the logits at a position depend on that position's token alone: each token of the chain
    has its own basis direction as embedding, and the head maps it to the chain's next token."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from wharf.core.chat_template import render_prompt_ids

    build(name, out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.add_tokens([p for p in pieces if p not in tok.get_vocab()])
    tok.save_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    assert not model.config.tie_word_embeddings
    eos = model.generation_config.eos_token_id
    chain = [render_prompt_ids(tok, prompt, tools)[-1], *tok.convert_tokens_to_ids(pieces),
             eos[0] if isinstance(eos, list) else eos]
    assert len(set(chain)) == len(chain), "each token of the chain must be a different one"
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        for k, (cur, nxt) in enumerate(zip(chain, chain[1:])):
            embed[cur] = 0.0
            embed[cur, k] = 1.0
            head[nxt] = 0.0
            head[nxt, k] = 30.0
    model.save_pretrained(out, safe_serialization=True)
    return out


class Lines(logging.Handler):
    """The engine's log lines, caught (what a test of the served model reads back)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def start_engine(model_dir: Path):
    """(the engine serving `model_dir` as "m" on the CPU, the log lines it wrote while starting)."""
    from wharf.core.config import EngineConfig
    from wharf.engine.server import Engine

    lines, wharf_log = Lines(), logging.getLogger("wharf")
    level = wharf_log.level
    wharf_log.addHandler(lines)
    wharf_log.setLevel(logging.INFO)
    try:
        engine = Engine(EngineConfig(model=str(model_dir), served_name="m", device="cpu", threads=2))
    finally:
        wharf_log.removeHandler(lines)
        wharf_log.setLevel(level)
    return engine, lines
