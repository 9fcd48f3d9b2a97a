"""The local engine: a Hugging Face causal LM behind vLLM's HTTP API, with token ids, processed
log-probs, continuous batching and runtime LoRA adapters. Run it with `python -m wharf.engine`."""
