"""What the recording proxy costs: latency added over direct calls, and recorded calls/s at 64 clients.

`python -m bench.proxy [--calls N] [--latency-calls N] [--clients 64] [--procs 2]`

The stub upstream (collect/testing/vllm_stub.py) and the proxy run as their own processes; the load comes
from several Python processes with aiohttp clients. With `taskset` available and 2+ CPUs, the
proxy is pinned to CPU 0 and the stub and load generator to the others, so the figures show the
proxy's own core. Each figure is one run on a machine shared with other work: expect noise.

The processes and the load generator are collect/testing/proxy_load.py, shared with
tests/test_proxy_load.py.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path


from collect.testing.proxy_load import (_cpus, admin, admin_access, chat_body, free_port, pinned, run_load,
                                        start_proxy, start_stub, stop)

_WRK_SCRIPT = """
local paths = {%s}
local keys = {%s}
local body = io.open("%s", "rb"):read("*a")
local i = 0
function setup(thread) thread:set("offset", i); i = i + 1 end
function init(args) n = offset end
function request()
  n = n + 1
  local k = (n %% #paths) + 1
  local headers = {["Content-Type"] = "application/json"}
  if keys[k] ~= "" then headers["Authorization"] = "Bearer " .. keys[k] end
  return wrk.format("POST", paths[k], headers, body)
end
"""


def run_wrk(base: str, paths: list[str], keys: list[str], body: bytes, connections: int, seconds: float, cpus,
            tmp: Path) -> dict:
    """Throughput with wrk (C: far cheaper per call than a Python client): calls/s, latency, non-2xx.
    `keys[i]`: the bearer key of `paths[i]` ('' for none)."""
    import re
    (tmp / "body.json").write_bytes(body)
    script = tmp / "load.lua"
    script.write_text(_WRK_SCRIPT % (", ".join(f'"{p}"' for p in paths), ", ".join(f'"{k}"' for k in keys),
                                     tmp / "body.json"))
    cmd = pinned(["wrk", "-t2", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", str(script), base], cpus)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

    def ms(label):
        m = re.search(rf"^\s*{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        v = float(m.group(1))
        return v / 1000 if m.group(2) == "us" else v * 1000 if m.group(2) == "s" else v

    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "requests": int(re.search(r"(\d+) requests in", out).group(1)),
            "p50": ms("50"), "p99": ms("99"), "non2xx": int(non2xx.group(1)) if non2xx else 0}


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux), to report CPU per call regardless of what else runs."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# -- the benchmark ----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.proxy", description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=10000, help="calls per throughput run")
    p.add_argument("--latency-calls", type=int, default=2000, help="sequential calls per latency run")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--procs", type=int, default=2, help="load generator processes")
    p.add_argument("--body-bytes", type=int, default=8192)
    p.add_argument("--stream", action="store_true", help="streaming calls instead of plain JSON")
    p.add_argument("--loadgen", choices=["auto", "wrk", "python"], default="auto",
                   help="throughput load: wrk when on PATH (auto), else Python aiohttp processes")
    p.add_argument("--seconds", type=float, default=10.0, help="duration of a wrk throughput run")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # still stop the stub and proxy in `finally`

    cpus = _cpus()
    proxy_cpus, other_cpus = ([cpus[0]], cpus[1:]) if len(cpus) > 1 else (None, None)
    tmp = Path(tempfile.mkdtemp(prefix="wharf-bench-proxy-"))
    stub_port, proxy_port = free_port(), free_port()
    stub = start_stub(stub_port, other_cpus)
    proxy = start_proxy(proxy_port, f"http://127.0.0.1:{stub_port}", tmp / "turns", proxy_cpus,
                        log=open(tmp / "proxy.log", "wb"))
    base = f"http://127.0.0.1:{proxy_port}"
    body = chat_body(args.body_bytes, args.stream)
    direct_url = f"http://127.0.0.1:{stub_port}/v1/chat/completions"
    # The direct run sends what the proxy would: the recording parameters included.
    direct_body = json.loads(body)
    direct_body.update(return_token_ids=True, logprobs=True, top_logprobs=0, temperature=1.0, top_p=1.0)
    if args.stream:
        direct_body["stream_options"] = {"include_usage": True}
    direct_body = json.dumps(direct_body).encode()
    hdr = {"Content-Type": "application/json"}
    try:
        access = admin_access(tmp / "turns")
        rollouts = [admin(access, "POST", "/admin/rollouts") for _ in range(args.clients)]
        via = [(f"{r['base_url']}/chat/completions", {**hdr, "Authorization": f"Bearer {r['api_key']}"}, body)
               for r in rollouts]
        direct = [(direct_url, hdr, direct_body)] * args.clients

        def latency(targets):
            run_load(targets[:1], 200, procs=1, cpus=other_cpus)  # warm-up
            res, _ = run_load(targets[:1], args.latency_calls, procs=1, cpus=other_cpus)
            lat = [r[4] * 1000 for r in res if r[2]]
            return pct(lat, 0.5), pct(lat, 0.99), len(lat)

        use_wrk = args.loadgen == "wrk" or (args.loadgen == "auto" and shutil.which("wrk"))

        def throughput(targets, wrk_base, wrk_paths, wrk_keys, wrk_body):
            if use_wrk:
                run_wrk(wrk_base, wrk_paths, wrk_keys, wrk_body, args.clients, 2, other_cpus, tmp)  # warm-up
                c0 = cpu_seconds(proxy.pid)
                w = run_wrk(wrk_base, wrk_paths, wrk_keys, wrk_body, args.clients, args.seconds, other_cpus, tmp)
                cpu = cpu_seconds(proxy.pid) - c0
                ok = w["requests"] - w["non2xx"]
                return w["rps"], w["p50"], w["p99"], ok, w["requests"], cpu / max(1, w["requests"]) * 1000
            run_load(targets, min(2000, args.calls), procs=args.procs, cpus=other_cpus)  # warm-up
            c0 = cpu_seconds(proxy.pid)
            res, wall = run_load(targets, args.calls, procs=args.procs, cpus=other_cpus)
            cpu = cpu_seconds(proxy.pid) - c0
            ok = sum(r[2] for r in res)
            lat = [r[4] * 1000 for r in res if r[2]]
            return ok / wall, pct(lat, 0.5), pct(lat, 0.99), ok, len(res), cpu / len(res) * 1000

        d_lat = latency(direct)
        p_lat = latency(via)
        d_tp = throughput(direct, f"http://127.0.0.1:{stub_port}", ["/v1/chat/completions"], [""], direct_body)
        p_tp = throughput(via, base, [f"/rollout/{r['rollout_id']}/v1/chat/completions" for r in rollouts],
                          [r["api_key"] for r in rollouts], body)
        for r in rollouts:
            admin(access, "POST", f"/admin/rollouts/{r['rollout_id']}/close")
        from collect.schema import read_dir
        table = read_dir(tmp / "turns", "turns")
        n_rows, n_ok = table.num_rows, sum(s == "ok" for s in table.column("status").to_pylist())
        import collections
        why = collections.Counter((e or "")[:40] for e in table.column("error").to_pylist() if e)
    finally:
        stop(proxy)
        stop(stub)
    mode = "streaming" if args.stream else "non-streaming"
    print(f"recording proxy vs direct to the vLLM stub ({mode}, {len(body)} B bodies, 50 completion tokens;"
          f" proxy on CPU {proxy_cpus or 'any'}, stub + load on CPU {other_cpus or 'any'}; "
          f"{os.cpu_count()} CPUs shared with other work: one run, expect noise)")
    print(f"{'':28}{'direct':>12}{'via proxy':>12}{'added / ratio':>16}")
    print(f"{'p50 latency, 1 client (ms)':28}{d_lat[0]:12.3f}{p_lat[0]:12.3f}{p_lat[0] - d_lat[0]:+16.3f}")
    print(f"{'p99 latency, 1 client (ms)':28}{d_lat[1]:12.3f}{p_lat[1]:12.3f}{p_lat[1] - d_lat[1]:+16.3f}")
    print(f"{f'calls/s, {args.clients} clients':28}{d_tp[0]:12.0f}{p_tp[0]:12.0f}{p_tp[0] / d_tp[0]:16.2f}")
    print(f"{f'p50 ms, {args.clients} clients':28}{d_tp[1]:12.2f}{p_tp[1]:12.2f}")
    print(f"{f'p99 ms, {args.clients} clients':28}{d_tp[2]:12.2f}{p_tp[2]:12.2f}")
    print(f"proxy CPU per recorded call at {args.clients} clients: {p_tp[5]:.3f} ms "
          f"(user+sys of the proxy process, shard writing included: ~{1000 / p_tp[5]:.0f} calls/s per core)")
    print(f"load generator: {'wrk' if use_wrk else f'{args.procs} Python aiohttp processes'}; recorded rows: "
          f"{n_rows} ({n_ok} ok) in {len(list((tmp / 'turns').glob('part-*')))} shards, for "
          f"{p_tp[4]} calls counted in the measured run ({p_tp[3]} ok) plus warm-up and latency runs")
    if why:  # wrk drops the calls in flight when its time is up: those are recorded as errors
        print("error rows:", dict(why))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
