"""Convert one generated job from a local dir and from s3:// (a SeaweedFS server on 127.0.0.1):
wall time of each, and what the bucket costs on top (pull of the job, push of the micro-batches).

`python -m bench.storage [--rollouts 256] [--size 0.3]`

s3 cold: an empty mirror (another machine: the job's parquet is pulled first); s3 warm: the
mirror holds the job already (only the listing is asked for); both push the micro-batches.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from wharf.convert.stage import convert_round
from testing.s3_server import SeaweedS3
from testing.synthetic_job import make_job
from wharf.core import storage
from wharf.core.config import load_config


def _convert(job: str, out: str) -> float:
    cfg = load_config(None, [f"convert.jobs=[{job}]", f"convert.out_dir={out}"])
    t0 = time.perf_counter()
    convert_round(cfg, progress=False)
    return time.perf_counter() - t0


def _size_mb(d: Path) -> float:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollouts", type=int, default=256)
    ap.add_argument("--size", type=float, default=0.3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="wharf-bench-s3-"))
    job = tmp / "job"
    info = make_job(job, args.rollouts, seed=0, shards=8, size=args.size)
    print(f"job: {info['rollouts']} rollouts, {info['turns']} turns, {info['stored_tokens'] / 1e6:.1f} M stored "
          f"tokens, {_size_mb(job):.1f} MB of parquet; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    local = _convert(str(job), str(tmp / "convert"))
    n_files = len(list((tmp / "convert").glob("*.safetensors")))
    print(f"local -> local: {local:.1f} s ({n_files} micro-batch files, {_size_mb(tmp / 'convert'):.1f} MB)")
    with SeaweedS3(tmp / "s3") as server:
        server.create_bucket("bench")
        os.environ.update(server.env)
        url = "s3://bench/job"
        t0 = time.perf_counter()
        for f in sorted(job.rglob("*")):
            if f.is_file():
                storage.put(f"{url}/{f.relative_to(job).as_posix()}", f.read_bytes())
        print(f"upload of the job: {time.perf_counter() - t0:.1f} s")
        for run in ("cold", "warm"):
            if run == "cold":
                os.environ["WHARF_MIRROR"] = str(tmp / "mirror")
            wall = _convert(url, "s3://bench/convert")
            print(f"s3 -> s3 ({run} mirror): {wall:.1f} s ({wall - local:+.1f} s beside local); "
                  f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
