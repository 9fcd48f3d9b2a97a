"""The engine's /metrics in Prometheus text format, named as vLLM names the same figures
(`vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total` count prompt tokens looked
up and reused), so a dashboard or a round's summary reads the local engine and vLLM alike."""
from __future__ import annotations

from .prefix_cache import PrefixCache


def prefix_stats(prefix: PrefixCache | None) -> dict:
    if prefix is None:
        return {"enabled": False}
    return {"enabled": True, "queries": prefix.queries, "hits": prefix.hits, "requests": prefix.requests,
            "hit_requests": prefix.hit_requests, "hit_rate": prefix.hits / prefix.queries if prefix.queries else 0.0,
            "entries": len(prefix), "bytes": prefix.bytes, "budget_bytes": prefix.budget, "evictions": prefix.evictions}


def metrics_text(model: str, batcher, prefix: PrefixCache | None) -> str:
    label = f'{{model_name="{model}"}}'
    rows = [
        ("vllm:num_requests_running", "gauge", "Sequences in the running batch.", len(batcher.running)),
        ("vllm:generation_tokens_total", "counter", "Generated tokens.", batcher.generated),
    ]
    if prefix is not None:
        rows += [
            ("vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
             prefix.queries),
            ("vllm:prefix_cache_hits_total", "counter", "Prompt tokens whose KV came from the prefix cache.",
             prefix.hits),
            ("wharf:prefix_cache_requests_total", "counter", "Prompts looked up.", prefix.requests),
            ("wharf:prefix_cache_hit_requests_total", "counter", "Prompts that reused a stored prefix.",
             prefix.hit_requests),
            ("wharf:prefix_cache_entries", "gauge", "Sequences kept.", len(prefix)),
            ("wharf:prefix_cache_bytes", "gauge", "Bytes of KV kept.", prefix.bytes),
            ("wharf:prefix_cache_evictions_total", "counter", "Entries dropped for the budget.", prefix.evictions),
        ]
    out = []
    for name, kind, help_, value in rows:
        out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{label} {value}"]
    return "\n".join(out) + "\n"
