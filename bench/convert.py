"""Convert a generated job of >= 20 M row tokens: tokens/s, peak memory, and the padding of
length bucketing beside naive pad-to-longest (fixed rows per batch, shuffled).

`python -m bench.convert [--rollouts 1000] [--dir DIR] [--keep]`

The job is real parquet written through wharf.schema (testing/synthetic_job.py):
rollouts of many turns whose prompts carry the whole history, with prefix breaks and retries.
"""
from __future__ import annotations

import argparse
import multiprocessing
import resource
import shutil
import tempfile
import time
from pathlib import Path

from wharf.core.config import load_config
from wharf.core.layout import CollectPaths
from testing.synthetic_job import make_job


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main(argv: list[str] | None = None) -> int:
    from wharf.core import envdefaults

    envdefaults.apply()  # before torch loads (convert imports it lazily)
    p = argparse.ArgumentParser(prog="python -m bench.convert", description=__doc__.splitlines()[0])
    p.add_argument("--rollouts", type=int, default=1000)
    p.add_argument("--dir", default=None, help="where the generated job and its conversion go (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the generated job (re-used by a later run with --dir)")
    args = p.parse_args(argv)
    base = Path(args.dir or tempfile.mkdtemp(prefix="wharf-bench-convert-"))
    job = base / "job"
    if not CollectPaths(job).rollouts.exists():
        t0 = time.perf_counter()
        # in a child process, so that the generator's memory is not in the conversion's peak
        with multiprocessing.get_context("fork").Pool(1) as pool:
            info = pool.apply(make_job, (job, args.rollouts))
        print(f"generated {info['rollouts']} rollouts, {info['turns']} calls, {info['stored_tokens'] / 1e6:.1f} M stored "
              f"tokens in {time.perf_counter() - t0:.1f} s -> {job}")
    from wharf.convert.stage import convert_round

    cfg = load_config(None, [f"convert.jobs=[{job}]", f"convert.out_dir={base / 'convert'}", "convert.max_seq_len=32768",
                             "convert.max_tokens_per_batch=65536", "convert.pad_multiple=64"])
    rss0 = _rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    stats = convert_round(cfg, progress=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tok, b = stats["tokens"], stats["batches"]
    print(f"convert: {stats['rollouts']['used']} rollouts, {stats['turns']['read']} calls, {stats['rows']['count']} rows "
          f"({stats['rows']['merged']} merged), {stats['prefix_breaks']['total']} prefix breaks, "
          f"{stats['rows']['truncated']} truncated")
    print(f"  row tokens      {tok['total'] / 1e6:.1f} M ({tok['trainable'] / 1e6:.1f} M trainable) in {wall:.2f} s: "
          f"{tok['total'] / wall / 1e6:.2f} M tokens/s ({cpu:.2f} CPU s: {tok['total'] / cpu / 1e6:.2f} M tokens per "
          f"CPU-second, the figure that holds on a shared machine)")
    print(f"  phases          " + ", ".join(f"{k} {v:.2f} s" for k, v in stats["phases_s"].items()))
    stored = stats["turns"]["stored_tokens"]
    print(f"  stored tokens   {stored / 1e6:.1f} M read (prompts carry the history): {stored / wall / 1e6:.2f} M tokens/s")
    print(f"  peak RSS        {peak:.0f} MiB ({rss0:.0f} MiB before converting)")
    print(f"  padding         bucketed {b['padding_fraction']:.1%} in {b['micro_batches']} micro-batches vs naive "
          f"pad-to-longest {b['naive_padding_fraction']:.1%} ({b['naive_rows_per_batch']} rows/batch, shuffled): "
          f"{b['naive_padding_fraction'] / max(b['padding_fraction'], 1e-9):.1f}x less padding")
    if not args.keep:
        shutil.rmtree(base / "convert", ignore_errors=True)
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
