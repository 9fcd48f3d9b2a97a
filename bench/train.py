"""Train-side memory and speed: chunked sampled-token log-probs beside a full log-softmax.

`python -m bench.train [--seq 4096] [--chunk 1024] [--device auto|cpu|cuda]` on SmolLM2-135M
with LoRA r16 on every linear projection, one row of `--seq` tokens:
- the loss path alone: hidden states -> sampled-token log-probs -> backward to the hidden
  states (naive: one [1, T, V] float32 log_softmax; chunked: train.loss.sampled_logprobs);
  its memory from one process per path, its time from both paths run alternately in one
  process (other load on the machine then slows both alike);
- the whole step (decoder forward + loss + backward), naive and chunked, each with and
  without activation checkpointing of the decoder layers.
Each variant runs in its own process so its peak memory (max RSS on the CPU, allocator peak on
CUDA) is its own. On the CPU MALLOC_MMAP_THRESHOLD_=1048576 keeps glibc from holding on to freed
activations (without it RSS peaks are inflated by GiBs).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from wharf.core import envdefaults

VARIANTS = ["loss-naive", "loss-chunked", "loss-time", "step-naive", "step-chunked", "step-naive-ckpt",
            "step-chunked-ckpt"]


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb(device: str, base_mb: float) -> float:
    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20 - base_mb
    with open("/proc/self/status") as f:
        hwm = next(line for line in f if line.startswith("VmHWM:"))
    return int(hwm.split()[1]) / 1024 - base_mb


def _model(device: str, ckpt: bool):
    from peft import LoraConfig, get_peft_model

    from wharf.core.model_store import embedded_model_dir, load_model

    model, _ = load_model(embedded_model_dir(), device, "float32")
    lc = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                         "up_proj", "down_proj"], task_type="CAUSAL_LM")
    peft = get_peft_model(model, lc)
    if ckpt:
        from wharf.train.model import enable_activation_checkpointing

        enable_activation_checkpointing(model)
    model.config.use_cache = False
    peft.train()
    return peft


def _inputs(seq: int, device: str):
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 49152, (1, seq), generator=g).to(device)
    return ids, torch.ones_like(ids), torch.arange(seq, device=device)[None], torch.ones(1, device=device)


def _loss_path(variant: str, seq: int, chunk: int, device: str, repeats: int) -> dict:
    import torch

    from wharf.train.loss import naive_logprobs, sampled_logprobs

    from safetensors import safe_open

    from wharf.core.model_store import embedded_model_dir

    with safe_open(str(embedded_model_dir() / "model.safetensors"), "pt") as f:
        weight = f.get_tensor("model.embed_tokens.weight").to(device)  # the tied lm_head
    ids, _, _, temps = _inputs(seq, device)
    hidden = torch.randn(1, seq - 1, weight.shape[1], device=device) * 2
    hidden.requires_grad_(True)
    base = _base(device)
    times = []
    for _ in range(repeats + 1):  # the first run warms up
        t0 = time.perf_counter()
        if variant == "loss-naive":
            lp = naive_logprobs(hidden, weight, ids[:, 1:], temps)
        else:
            lp = sampled_logprobs(hidden, weight, ids[:, 1:], temps, chunk)[0]
        lp.mean().backward()
        _sync(device)
        times.append(time.perf_counter() - t0)
        hidden.grad = None
        del lp
    return {"s": sorted(times[1:])[len(times[1:]) // 2], "peak_mb": _peak_mb(device, base)}


def _loss_time(seq: int, chunk: int, device: str, repeats: int) -> dict:
    """Both loss paths timed alternately in one process, so load from other work hits both alike."""
    import torch

    from wharf.train.loss import naive_logprobs, sampled_logprobs

    weight = torch.randn(49152, 576, device=device) * 0.05
    ids, _, _, temps = _inputs(seq, device)
    hidden = (torch.randn(1, seq - 1, 576, device=device) * 2).requires_grad_(True)
    paths = {"naive": lambda: naive_logprobs(hidden, weight, ids[:, 1:], temps),
             "chunked": lambda: sampled_logprobs(hidden, weight, ids[:, 1:], temps, chunk)[0]}
    times: dict[str, list[float]] = {k: [] for k in paths}
    for r in range(repeats + 1):
        for name, fn in paths.items():
            t0 = time.perf_counter()
            fn().mean().backward()
            _sync(device)
            if r:  # the first round warms up
                times[name].append(time.perf_counter() - t0)
            hidden.grad = None
    return {f"{k}_s": sorted(v)[len(v) // 2] for k, v in times.items()}


def _step(variant: str, seq: int, chunk: int, device: str, repeats: int) -> dict:
    import torch

    from wharf.train.loss import LossConfig, StepNorm, grpo_loss, naive_logprobs, sampled_logprobs

    peft = _model(device, variant.endswith("ckpt"))
    causal = peft.get_base_model()
    ids, am, pos, temps = _inputs(seq, device)
    mask = torch.ones(1, seq - 1, device=device)
    base = _base(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        hidden = causal.model(input_ids=ids, attention_mask=am, position_ids=pos, use_cache=False).last_hidden_state
        w = causal.get_output_embeddings().weight
        if "naive" in variant:
            lp = naive_logprobs(hidden[:, :-1], w, ids[:, 1:], temps)
        else:
            lp = sampled_logprobs(hidden[:, :-1], w, ids[:, 1:], temps, chunk)[0]
        loss, _ = grpo_loss(lp, lp.detach(), mask, torch.ones(1, device=device), torch.ones(1, device=device),
                            LossConfig(mismatch="none"), StepNorm(seq - 1, 1))
        loss.backward()
        _sync(device)
        times.append(time.perf_counter() - t0)
        peft.zero_grad(set_to_none=True)
        del hidden, lp, loss
    return {"s": sorted(times)[len(times) // 2], "peak_mb": _peak_mb(device, base)}


def _base(device: str) -> float:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / 2**20
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak RSS (VmHWM): loading the model peaked higher than what we measure
    return _rss_mb()  # what the process holds before the measured work (model, inputs)


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def child(args) -> None:
    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if args.child == "loss-time":
        out = _loss_time(args.seq, args.chunk, device, args.repeats)
    else:
        fn = _loss_path if args.child.startswith("loss") else _step
        out = fn(args.child, args.seq, args.chunk, device, args.repeats if args.child.startswith("loss") else args.step_repeats)
    print(json.dumps({"variant": args.child, "device": device, **out}))


def run_all(args) -> list[dict]:
    env = envdefaults.child_env(MALLOC_MMAP_THRESHOLD_="1048576")
    rows = []
    for v in [v for v in VARIANTS if v.startswith(args.only or "")]:
        cmd = [sys.executable, "-m", "bench.train", "--child", v, "--seq", str(args.seq), "--chunk", str(args.chunk),
               "--device", args.device, "--repeats", str(args.repeats), "--step-repeats", str(args.step_repeats)]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.exit(f"bench.train: {v} failed:\n{r.stderr[-3000:]}")
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
        print(f"  {v}: {json.dumps(rows[-1])}", file=sys.stderr)
    return rows


def table(rows: list[dict], seq: int) -> str:
    by = {r["variant"]: r for r in rows}
    if "loss-time" in by:  # the interleaved timing replaces the one-path-per-process timing
        for name in ("naive", "chunked"):
            by[f"loss-{name}"]["s"] = by["loss-time"][f"{name}_s"]
    rows = [r for r in rows if r["variant"] != "loss-time"]
    ref = {k: by[f"{k}-naive"] for k in ("loss", "step") if f"{k}-naive" in by}
    lines = [f"seq {seq} tokens, device {rows[0]['device']}; memory = peak above what the process held before",
             "| variant | tokens/s | peak memory (MiB) | memory vs naive | time vs naive |", "|---|---|---|---|---|"]
    for r in rows:
        n = ref[r["variant"].split("-")[0]]
        lines.append(f"| {r['variant']} | {seq / r['s']:.0f} | {r['peak_mb']:.0f} | {r['peak_mb'] / n['peak_mb']:.2f}x "
                     f"| {r['s'] / n['s']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.train")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--repeats", type=int, default=3, help="timed runs of the loss path (median)")
    p.add_argument("--step-repeats", type=int, default=1, help="timed runs of each whole step (median)")
    p.add_argument("--only", choices=["loss", "step"], help="run only the loss path or only the whole step")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    print(table(run_all(args), args.seq))


if __name__ == "__main__":
    main()
