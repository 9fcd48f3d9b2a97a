"""`python -m bench.engine`: the local engine side by side with what it is measured against, in one run.

- Generated tokens/s at 1, 4, 16 and 32 concurrent requests, beside plain one-at-a-time
  `model.generate` and beside the compute limit (2 FLOP a parameter a token against a measured
  fp32 matmul peak of these threads), and 32 concurrent at engine.max_batch 16.
- The prefix cache on and off (bench/engine_prefix.py): one attempt of a ~1,000-token prompt, a
  group of 4 attempts of one, a rollout's follow-up call.
- The anchor: llama.cpp on the same GGUF (bench/llamacpp.py), where llama-cpp-python is installed.
- The base against a LoRA adapter (the trainer's default shape: r16 on all seven projections) at
  1 and 16 concurrent requests, alternately, as a ratio.

Every request generates exactly TOKENS tokens (ignore_eos), so the figures compare like with like.
The cores here are shared: the load average is printed beside the figures.
"""
from __future__ import annotations

from wharf.core import envdefaults

envdefaults.apply()  # before torch loads

import argparse  # noqa: E402
import concurrent.futures  # noqa: E402
import contextlib  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

from bench import llamacpp  # noqa: E402
from bench.engine_prefix import engine_chat, prefix_rows, print_prefix_table  # noqa: E402
from wharf.core.config import TrainConfig  # noqa: E402

TRAIN = TrainConfig()  # the bench adapter has the trainer's default shape
PROMPTS = [
    "Write a shell command that counts the lines of every Python file in a directory.",
    "Explain what a race condition is.",
    "Give three tips for writing readable code.",
    "What does `git rebase` do?",
    "Write a haiku about compilers.",
    "How do I reverse a list in Python?",
    "Name the planets of the solar system.",
    "What is the difference between a process and a thread?",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _peak_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run_engine(url: str, concurrency: int, n_requests: int, tokens: int, api_key: str | None = None,
               model: str = "smollm2-135m") -> tuple[int, float]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key=api_key or "EMPTY", max_retries=0, timeout=600)

    def one(i: int) -> int:
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            max_tokens=tokens, temperature=1.0, seed=i, extra_body={"ignore_eos": True})
        return r.usage.completion_tokens

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        n = sum(pool.map(one, range(n_requests)))
    return n, time.perf_counter() - t0


def run_generate(n_requests: int, tokens: int, threads: int) -> tuple[int, float, int]:
    """(tokens, seconds, the model's parameters)."""
    import torch

    from wharf.core import model_store

    torch.set_num_threads(threads)
    model, tok = model_store.load_model(model_store.embedded_model_dir(), "cpu", "float32")
    n, t0 = 0, None
    with torch.inference_mode():
        for i in range(n_requests + 1):  # the first call warms up and is not timed
            ids = tok.apply_chat_template([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                          add_generation_prompt=True, return_tensors="pt", return_dict=True)
            if i == 1:
                t0 = time.perf_counter()
            out = model.generate(**ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=True,
                                 temperature=1.0, top_p=1.0, top_k=0, pad_token_id=tok.pad_token_id)
            if i >= 1:
                n += out.shape[1] - ids["input_ids"].shape[1]
    return n, time.perf_counter() - t0, sum(p.numel() for p in model.parameters())


def save_adapter(out: Path) -> Path:
    """A random r16 adapter on all seven projections (speed does not depend on the values)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from wharf.core import model_store

    t = TRAIN
    torch.manual_seed(0)
    base, _ = model_store.load_model(model_store.embedded_model_dir(), "cpu", "float32")
    get_peft_model(base, LoraConfig(r=t.lora_rank, lora_alpha=t.lora_alpha, target_modules=t.lora_target_modules,
                                    init_lora_weights=False)).save_pretrained(out)
    return out


def adapter_vs_base(ep, url: str, tokens: int, repeats: int) -> list[tuple[str, int, int, float]]:
    """Base and adapter rows at 1 and 16 concurrent requests, taken alternately `repeats` times."""
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as d:
        status, text = ep.request("POST", "/v1/load_lora_adapter",
                                  {"lora_name": "policy-v1", "lora_path": str(save_adapter(Path(d) / "policy-v1"))})
        if status != 200:
            raise SystemExit(f"loading the bench adapter failed: {status} {text}")
    run_engine(url, 1, 1, 4, ep.api_key, "policy-v1")  # warm-up: the first adapter batch merges its weights
    sums: dict[tuple[str, int], list] = {}
    for rep in range(repeats):
        for conc in (1, 16):
            # Swap which goes first each repeat, so a load that drifts weighs on both alike.
            for model in ("smollm2-135m", "policy-v1")[::1 if rep % 2 == 0 else -1]:
                n, dt = run_engine(url, conc, 2 if conc == 1 else conc, tokens, ep.api_key, model)
                acc = sums.setdefault((model, conc), [0, 0, 0.0])
                acc[0] += 2 if conc == 1 else conc
                acc[1] += n
                acc[2] += dt
    return [(f"{'base' if m == 'smollm2-135m' else 'adapter'}, {c} concurrent", *v) for (m, c), v in sums.items()]


def matmul_gflops(threads: int, n: int = 1024) -> float:
    """The best of 5 fp32 n x n matmuls: the compute peak these threads reach in practice."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(6):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e9


def throughput_rows(url: str, key: str | None, tokens: int, label: str, levels,
                    repeats: int = 1) -> list[tuple[str, int, int, float]]:
    """Tokens/s at each concurrency, `repeats` runs each summed (one run of 16 requests moves by
    +-25% from one bench to the next: its prefills and the machine's moment weigh on it)."""
    run_engine(url, 1, 1, 4, key)  # warm-up
    rows = []
    for conc in levels:
        n_req = max(conc, 2)
        runs = [run_engine(url, conc, n_req, tokens, key) for _ in range(repeats)]
        rows.append((f"{label}, {conc} concurrent", n_req * repeats, sum(n for n, _ in runs), sum(dt for _, dt in runs)))
    return rows


def engine_config(threads: int, *overrides: str):
    from wharf.core.config import load_config

    return load_config(None, [f"endpoint.url=http://127.0.0.1:{_free_port()}", f"engine.threads={threads}",
                              *overrides])


def alternate(runs: dict[str, Callable[[int], dict[str, float]]], repeats: int) -> dict[str, dict[str, float]]:
    """Each run `repeats` times, in turn, the order reversed every other repeat (a load that drifts
    weighs on all alike); each run's figures summed."""
    sums: dict[str, dict[str, float]] = {name: {} for name in runs}
    for rep in range(repeats):
        for name in list(runs)[::1 if rep % 2 == 0 else -1]:
            for key, value in runs[name](rep).items():
                sums[name][key] = sums[name].get(key, 0.0) + value
    return sums


def measure(args) -> dict:
    from wharf.engine.launch import launch

    r: dict = {"load": [os.getloadavg()[0]], "anchor": None, "anchor_why": "--no-llama"}
    cfg = engine_config(args.threads)
    r["max_batch"] = cfg.engine.max_batch
    with contextlib.ExitStack() as stack:  # both engines up at once, idle but for the one measured
        on = stack.enter_context(launch(cfg))
        off = stack.enter_context(launch(engine_config(args.threads, "engine.prefix_cache=false",
                                                       "engine.max_batch=16")))
        r["rows"] = throughput_rows(on.url, on.api_key, args.tokens, "engine", (1, 4, 16), args.repeats)
        run_engine(off.url, 1, 1, 4, off.api_key)  # warm-up

        def at_32(ep):
            return lambda rep: dict(zip(("tokens", "seconds"), run_engine(ep.url, 32, 32, args.tokens, ep.api_key)))

        wide = alternate({"engine, 32 concurrent": at_32(on), "max_batch 16, cache off, 32 concurrent": at_32(off)},
                         args.repeats)
        r["rows"] += [(name, 32 * args.repeats, int(v["tokens"]), v["seconds"]) for name, v in wide.items()]
        backends = {"on": engine_chat(on.url, on.api_key, args.tokens),
                    "off": engine_chat(off.url, off.api_key, args.tokens)}
        if not args.no_llama:
            loaded, r["anchor_why"] = llamacpp.load(args.llama_threads or args.threads)
            if loaded:
                backends["llama"] = llamacpp.llama_chat(*loaded, args.tokens)
                r["anchor_decode"] = (8 * args.tokens, llamacpp.decode_seconds(backends["llama"], PROMPTS, 8))
        prefix = alternate({name: (lambda rep, name=name: prefix_rows(backends[name], f"{name}-{rep}", name != "llama"))
                            for name in backends}, args.repeats)
        r["on"], r["off"], r["anchor"] = prefix["on"], prefix["off"], prefix.get("llama")
        r["load"].append(os.getloadavg()[0])
        r["lora"] = adapter_vs_base(on, on.url, args.tokens, args.repeats)
        r["rss"] = _peak_rss_mib(on.process.pid) if on.process else None
    r["generate"] = run_generate(4, args.tokens, args.threads)
    r["gflops"] = matmul_gflops(args.threads)
    r["load"].append(os.getloadavg()[0])
    return r


def report(r: dict, args) -> None:
    n, dt, params = r["generate"]
    base = n / dt
    limit = r["gflops"] * 1e9 / (2 * params)
    print(f"SmolLM2-135M-Instruct, CPU fp32, {args.threads} torch threads "
          f"(llama.cpp: {args.llama_threads or args.threads}), {args.tokens} tokens per request; "
          f"load average {' -> '.join(f'{x:.1f}' for x in r['load'])} (start, prefix rows done, end)")
    print(f"compute limit: {params / 1e6:.1f} M parameters = {2 * params / 1e9:.2f} GFLOP a token; "
          f"fp32 matmul peak {r['gflops']:.0f} GFLOP/s -> {limit:.0f} tok/s")
    print(f"{'path':<40} {'requests':>8} {'tokens':>7} {'seconds':>8} {'tok/s':>7} {'vs generate':>12} {'of limit':>9}")
    rows = [("model.generate, 1 at a time", 4, n, dt), *r["rows"]]
    if r.get("anchor_decode"):
        tokens, secs = r["anchor_decode"]
        rows.append(("llama.cpp (Q4_1), 1 at a time", 8, tokens, secs))
    for name, n_req, k, secs in rows:
        print(f"{name:<40} {n_req:>8} {k:>7} {secs:>8.2f} {k / secs:>7.1f} {k / secs / base:>11.2f}x "
              f"{k / secs / limit:>8.0%}")
    speed = {name: k / secs for name, _, k, secs in rows}
    print(f"32 concurrent: max_batch {r['max_batch']} (cache on) / max_batch 16 (cache off): "
          f"{speed['engine, 32 concurrent'] / speed['max_batch 16, cache off, 32 concurrent']:.2f}x")
    if r.get("anchor_decode"):
        for conc in (1, 16, 32):
            print(f"engine at {conc} concurrent / llama.cpp: "
                  f"{speed[f'engine, {conc} concurrent'] / speed['llama.cpp (Q4_1), 1 at a time']:.2f}x")
    print(f"\nprefix cache: a ~1,070-token prompt (seconds a call or a group, summed over {args.repeats} "
          f"repeats taken in turn; every call {args.tokens} tokens)")
    print_prefix_table(r["on"], r["off"], r["anchor"])
    if r["anchor"] is None:
        print(f"llama.cpp anchor not run: {r['anchor_why']}")
    print(f"\nbase vs a LoRA adapter (r{TRAIN.lora_rank} on {', '.join(TRAIN.lora_target_modules)}), "
          f"alternately, {args.repeats} times each")
    print(f"{'path':<26} {'requests':>8} {'tokens':>7} {'seconds':>8} {'tok/s':>7}")
    for name, n_req, k, secs in r["lora"]:
        print(f"{name:<26} {n_req:>8} {k:>7} {secs:>8.2f} {k / secs:>7.1f}")
    lora = {name: k / secs for name, _, k, secs in r["lora"]}
    for conc in (1, 16):
        print(f"adapter / base at {conc} concurrent: {lora[f'adapter, {conc} concurrent'] / lora[f'base, {conc} concurrent']:.2f}")
    if r["rss"] is not None:
        print(f"engine peak RSS: {r['rss']:.0f} MiB")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32, help="tokens generated per request")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (engine and generate), llama.cpp threads")
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs per throughput row, prefix row and base/adapter row, summed (alternated where two are compared)")
    ap.add_argument("--no-llama", action="store_true", help="skip the llama.cpp anchor")
    ap.add_argument("--llama-threads", type=int, default=0,
                    help="llama.cpp threads (default --threads; on cores other work shares, 1 can be faster: its "
                         "threads wait on each other spinning)")
    args = ap.parse_args(argv)
    report(measure(args), args)


if __name__ == "__main__":
    main()
