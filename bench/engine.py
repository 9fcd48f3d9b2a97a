"""`python -m bench.engine`: generated tokens/s of the local engine at 1, 4 and 16 concurrent
requests, beside plain one-at-a-time `model.generate` measured in the same run; then the base
against a LoRA adapter (the trainer's default shape: r16 on all seven projections) at 1 and 16
concurrent requests, alternately, printed as a ratio.

Every request generates exactly TOKENS tokens (ignore_eos), so the figures compare like with like.
The 2 cores here are shared: read the figures as noisy.
"""
from __future__ import annotations

from wharf import envdefaults

envdefaults.apply()  # before torch loads

import argparse  # noqa: E402
import concurrent.futures  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from wharf.config import TrainConfig  # noqa: E402

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


def run_generate(n_requests: int, tokens: int, threads: int) -> tuple[int, float]:
    import torch

    from wharf import model_store

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
    return n, time.perf_counter() - t0


def save_adapter(out: Path) -> Path:
    """A random r16 adapter on all seven projections (speed does not depend on the values)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from wharf import model_store

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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32, help="tokens generated per request")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (engine and generate)")
    ap.add_argument("--repeats", type=int, default=4, help="alternate base/adapter runs per concurrency")
    args = ap.parse_args(argv)

    from wharf.config import load_config
    from engine.launch import launch

    url = f"http://127.0.0.1:{_free_port()}"
    cfg = load_config(None, [f"endpoint.url={url}", f"engine.threads={args.threads}"])
    rows = []
    with launch(cfg) as ep:
        run_engine(url, 1, 1, 4, ep.api_key)  # warm-up; the key launch gave the engine
        for conc, n_req in ((1, 2), (4, 4), (16, 16)):
            n, dt = run_engine(url, conc, n_req, args.tokens, ep.api_key)
            rows.append((f"engine, {conc} concurrent", n_req, n, dt))
        lora_rows = adapter_vs_base(ep, url, args.tokens, args.repeats)
        rss = _peak_rss_mib(ep.process.pid) if ep.process else None
    n, dt = run_generate(4, args.tokens, args.threads)
    base = n / dt
    print(f"SmolLM2-135M-Instruct, CPU fp32, {args.threads} torch threads, {args.tokens} tokens per request "
          f"(shared cores: expect noise)")
    print(f"{'path':<26} {'requests':>8} {'tokens':>7} {'seconds':>8} {'tok/s':>7} {'vs generate':>12}")
    print(f"{'model.generate, 1 at a time':<26} {4:>8} {n:>7} {dt:>8.2f} {base:>7.1f} {1.0:>11.2f}x")
    for name, n_req, n, dt in rows:
        print(f"{name:<26} {n_req:>8} {n:>7} {dt:>8.2f} {n / dt:>7.1f} {n / dt / base:>11.2f}x")
    print(f"\nbase vs a LoRA adapter (r{TRAIN.lora_rank} on {', '.join(TRAIN.lora_target_modules)}), "
          f"alternately, {args.repeats} times each")
    print(f"{'path':<26} {'requests':>8} {'tokens':>7} {'seconds':>8} {'tok/s':>7}")
    for name, n_req, n, dt in lora_rows:
        print(f"{name:<26} {n_req:>8} {n:>7} {dt:>8.2f} {n / dt:>7.1f}")
    speed = {name: n / dt for name, _, n, dt in lora_rows}
    for conc in (1, 16):
        print(f"adapter / base at {conc} concurrent: {speed[f'adapter, {conc} concurrent'] / speed[f'base, {conc} concurrent']:.2f}")
    if rss is not None:
        print(f"engine peak RSS: {rss:.0f} MiB")


if __name__ == "__main__":
    main()
