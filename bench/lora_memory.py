"""GPU memory of LoRA training and of vLLM serving per model size: an estimate from parameter
counts, no GPU needed (docs/gpus.md).

`python -m bench.lora_memory [--tokens 16384] [--rank 16] [--chunk 1024]`

Each model is built from its family's published dimensions on torch's meta device (no weights,
no download), so the parameter counts are transformers' own; the LoRA parameters are those of
train.lora_target_modules' default (every attention and MLP projection) at --rank. Per GPU that
trains (one process, the loop's or one `accelerate launch` rank):
- base weights: fp32, 4 B a parameter: wharf/train/model.py loads the base in float32 and
  train.mixed_precision=bf16 autocasts the matmuls (bf16 weights would halve this column);
- LoRA state: fp32 parameters, gradients and AdamW's two moments, 16 B a LoRA parameter;
- activations of one micro-batch of --tokens tokens (convert.max_tokens_per_batch) with
  train.grad_checkpointing: each layer's fp32 input kept (T x hidden x 4 B x layers), one layer
  recomputed in backward (bf16 outputs of its projections and their gradients, about
  T x (4 x intermediate + 6 x hidden) x 2 B x 2), and the chunked head (--chunk positions x
  vocab x 4 B x 3: logits, log-softmax, gradient).
vLLM holds the bf16 weights and a KV cache of 2 x layers x kv_heads x head_dim x 2 B a token.
An estimate: allocator overheads, fragmentation, CUDA's context (~0.5-1 GiB) and the attention
kernel's workspace are not in it; the one measured point it is checked against is printed last.
"""
from __future__ import annotations

import argparse

GiB = 2**30
# (name, config class, published dimensions: hidden, layers, intermediate, heads, kv heads, vocab, tied)
MODELS = [
    ("SmolLM2-135M (embedded)", "LlamaConfig", 576, 30, 1536, 9, 3, 49152, True),
    ("Qwen2.5-0.5B", "Qwen2Config", 896, 24, 4864, 14, 2, 151936, True),
    ("Qwen2.5-1.5B", "Qwen2Config", 1536, 28, 8960, 12, 2, 151936, True),
    ("Qwen2.5-3B", "Qwen2Config", 2048, 36, 11008, 16, 2, 151936, True),
    ("Qwen2.5-7B", "Qwen2Config", 3584, 28, 18944, 28, 4, 152064, False),
    ("Llama-3.1-8B", "LlamaConfig", 4096, 32, 14336, 32, 8, 128256, False),
    ("Qwen2.5-14B", "Qwen2Config", 5120, 48, 13824, 40, 8, 152064, False),
    ("Qwen2.5-32B", "Qwen2Config", 5120, 64, 27648, 40, 8, 152064, False),
]
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def counts(cls_name: str, hidden: int, layers: int, inter: int, heads: int, kv: int, vocab: int, tied: bool,
           rank: int) -> tuple[int, int]:
    """(parameters, LoRA parameters at `rank` on TARGETS) of the model built on the meta device."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    config = getattr(transformers, cls_name)(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                                             num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                                             tie_word_embeddings=tied)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    lora = sum(rank * (m.in_features + m.out_features) for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in TARGETS)
    return params, lora


def estimate(params: int, lora: int, hidden: int, layers: int, inter: int, heads: int, kv: int, vocab: int,
             tokens: int, chunk: int) -> dict[str, float]:
    """GiB of each part (pure arithmetic; the docstring above says what each assumes)."""
    head_dim = hidden // heads
    parts = {"weights_fp32": 4 * params, "lora_state": 16 * lora, "ckpt": tokens * hidden * 4 * layers,
             "layer": tokens * (4 * inter + 6 * hidden) * 2 * 2, "head": chunk * vocab * 4 * 3}
    parts["train_total"] = sum(parts.values())
    # the one measured point has the activations at ~2.2x this estimate (main() prints it): plan with 2x
    parts["train_2x_act"] = parts["train_total"] + parts["ckpt"] + parts["layer"] + parts["head"]
    parts["weights_bf16"] = 2 * params
    parts["kv_per_1k_tokens"] = 1000 * 2 * layers * kv * head_dim * 2
    return {k: v / GiB for k, v in parts.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=16384, help="tokens a micro-batch (convert.max_tokens_per_batch)")
    p.add_argument("--rank", type=int, default=16, help="train.lora_rank")
    p.add_argument("--chunk", type=int, default=1024, help="train.logprob_chunk")
    args = p.parse_args()
    print(f"LoRA r{args.rank} on {', '.join(TARGETS)}; a micro-batch of {args.tokens} tokens; GiB")
    print(f"{'model':<24} {'params':>7} {'LoRA':>6} | {'base fp32':>9} {'LoRA+Adam':>9} {'ckpt':>6} {'layer':>6} "
          f"{'head':>5} {'train':>6} {'2x act':>6} | {'vLLM bf16':>9} {'KV/1k tok':>9}")
    for name, cls_name, *dims in MODELS:
        params, lora = counts(cls_name, *dims, rank=args.rank)
        hidden, layers, inter, heads, kv, vocab, _ = dims
        e = estimate(params, lora, hidden, layers, inter, heads, kv, vocab, args.tokens, args.chunk)
        print(f"{name:<24} {params / 1e9:6.2f}B {lora / 1e6:5.1f}M | {e['weights_fp32']:9.1f} {e['lora_state']:9.2f} "
              f"{e['ckpt']:6.1f} {e['layer']:6.1f} {e['head']:5.1f} {e['train_total']:6.1f} {e['train_2x_act']:6.1f} | "
              f"{e['weights_bf16']:9.1f} {e['kv_per_1k_tokens']:9.3f}")
    # The check: bench.train on an H100 (docs/development.md), SmolLM2-135M, one row of 4096 tokens,
    # fp32, chunked loss + checkpointing: the step's allocator peak beyond the weights, 2,697 MiB.
    name, cls_name, *dims = MODELS[0]
    params, lora = counts(cls_name, *dims, rank=16)
    hidden, layers, inter, heads, kv, vocab, _ = dims
    e = estimate(params, lora, hidden, layers, inter, heads, kv, vocab, 4096, 1024)
    fp32 = e["ckpt"] + 2 * e["layer"] + e["head"] + e["lora_state"]  # fp32 activations: the layer's double
    print(f"check: {name} at 4096 tokens in fp32, estimate {fp32 * 1024:.0f} MiB beyond the weights; "
          "bench.train --device cuda measured 2697 MiB (H100)")


if __name__ == "__main__":
    main()
