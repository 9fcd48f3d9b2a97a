"""What the recording proxy costs: latency added over direct calls, and recorded calls/s at 64 clients,
with the WAL's group-commit fsync on (the default: power-loss durable) and off, side by side.

`python -m bench.proxy [--calls N] [--latency-calls N] [--clients 64] [--procs 2] [--seconds 10]`

The stub upstream (testing/vllm_stub.py) and the proxy run as their own processes; the load comes
from several Python processes with aiohttp clients. With `taskset` available and 2+ CPUs, the
proxy is pinned to CPU 0 and the stub and load generator to the others, so the figures show the
proxy's own core. Each figure is one run on a machine shared with other work: expect noise.

The processes and the load generator are testing/proxy_load.py, shared with
tests/test_proxy_load.py.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from testing.proxy_load import (_cpus, admin, admin_access, chat_body, free_port, pinned, run_load,
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
def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.proxy", description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=10000, help="calls per throughput run (Python load generator)")
    p.add_argument("--latency-calls", type=int, default=2000, help="sequential calls per latency run")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--procs", type=int, default=2, help="load generator processes")
    p.add_argument("--body-bytes", type=int, default=8192)
    p.add_argument("--stream", action="store_true", help="streaming calls instead of plain JSON")
    p.add_argument("--loadgen", choices=["auto", "wrk", "python"], default="auto",
                   help="throughput load: wrk when on PATH (auto), else Python aiohttp processes")
    p.add_argument("--seconds", type=float, default=10.0, help="duration of a wrk throughput run")
    return p.parse_args(argv)


class Bench:
    """The measurements, against the stub directly or through a proxy at `base` (same targets, same load)."""

    def __init__(self, args, tmp: Path, other_cpus):
        self.args, self.tmp, self.cpus = args, tmp, other_cpus
        self.use_wrk = args.loadgen == "wrk" or (args.loadgen == "auto" and shutil.which("wrk"))

    def latency(self, targets):
        """p50, p99 (ms) and count of sequential calls from one client (one connection)."""
        run_load(targets[:1], 200, procs=1, cpus=self.cpus)  # warm-up
        res, _ = run_load(targets[:1], self.args.latency_calls, procs=1, cpus=self.cpus)
        lat = [r[4] * 1000 for r in res if r[2]]
        return pct(lat, 0.5), pct(lat, 0.99), len(lat)

    def throughput(self, targets, wrk_base, wrk_paths, wrk_keys, wrk_body, pid):
        """calls/s, p50, p99, ok calls, calls, CPU ms per call of process `pid`; `wrk_keys[i]`: the bearer
        key of `wrk_paths[i]` ('' for none)."""
        a = self.args
        if self.use_wrk:
            run_wrk(wrk_base, wrk_paths, wrk_keys, wrk_body, a.clients, 2, self.cpus, self.tmp)  # warm-up
            c0 = cpu_seconds(pid)
            w = run_wrk(wrk_base, wrk_paths, wrk_keys, wrk_body, a.clients, a.seconds, self.cpus, self.tmp)
            cpu = cpu_seconds(pid) - c0
            n = w["requests"]
            return w["rps"], w["p50"], w["p99"], n - w["non2xx"], n, cpu / max(1, n) * 1000
        run_load(targets, min(2000, a.calls), procs=a.procs, cpus=self.cpus)  # warm-up
        c0 = cpu_seconds(pid)
        res, wall = run_load(targets, a.calls, procs=a.procs, cpus=self.cpus)
        cpu = cpu_seconds(pid) - c0
        ok = sum(r[2] for r in res)
        lat = [r[4] * 1000 for r in res if r[2]]
        return ok / wall, pct(lat, 0.5), pct(lat, 0.99), ok, len(res), cpu / len(res) * 1000


def via_proxy(bench: Bench, stub_port: int, body: bytes, fsync: bool, cpus) -> dict:
    """Start a proxy with `proxy.wal_fsync=<fsync>`, measure it, check what it recorded, stop it."""
    tmp, hdr = bench.tmp / f"fsync-{fsync}", {"Content-Type": "application/json"}
    port = free_port()
    with open(bench.tmp / f"proxy-{fsync}.log", "wb") as log:
        proxy = start_proxy(port, f"http://127.0.0.1:{stub_port}", tmp / "turns", cpus,
                            extra=[f"proxy.wal_fsync={str(fsync).lower()}"], log=log)
    base = f"http://127.0.0.1:{port}"
    try:
        access = admin_access(tmp / "turns")
        rollouts = [admin(access, "POST", "/admin/rollouts") for _ in range(bench.args.clients)]
        targets = [(f"{r['base_url']}/chat/completions", {**hdr, "Authorization": f"Bearer {r['api_key']}"}, body)
                   for r in rollouts]
        lat = bench.latency(targets)
        tp = bench.throughput(targets, base, [f"/rollout/{r['rollout_id']}/v1/chat/completions" for r in rollouts],
                              [r["api_key"] for r in rollouts], body, proxy.pid)
        syncs = _metric(base, "wharf_proxy_wal_fsyncs_total")
        for r in rollouts:
            admin(access, "POST", f"/admin/rollouts/{r['rollout_id']}/close")
    finally:
        stop(proxy)
    from wharf.core.schema import read_dir
    status = collections.Counter(read_dir(tmp / "turns", "turns").column("status").to_pylist())
    return {"lat": lat, "tp": tp, "status": dict(status), "fsyncs": syncs}


def _metric(base: str, name: str) -> float | None:
    import urllib.request
    with urllib.request.urlopen(f"{base}/metrics") as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def report(args, body: bytes, direct: dict, on: dict, off: dict, proxy_cpus, other_cpus, use_wrk) -> None:
    mode = "streaming" if args.stream else "non-streaming"
    print(f"recording proxy vs direct to the vLLM stub ({mode}, {len(body)} B bodies, 50 completion tokens;"
          f" proxy on CPU {proxy_cpus or 'any'}, stub + load on CPU {other_cpus or 'any'}; "
          f"{os.cpu_count()} CPUs shared with other work: one run, expect noise)")
    print(f"{'':30}{'direct':>10}{'fsync on':>11}{'fsync off':>11}{'added (on)':>12}{'on / off':>10}")
    d, a, b = direct["lat"], on["lat"], off["lat"]
    for i, name in ((0, "p50"), (1, "p99")):
        print(f"{name + ' latency, 1 client (ms)':30}{d[i]:10.3f}{a[i]:11.3f}{b[i]:11.3f}{a[i] - d[i]:+12.3f}"
              f"{a[i] / b[i]:10.2f}")
    d, a, b = direct["tp"], on["tp"], off["tp"]
    print(f"{f'calls/s, {args.clients} connections':30}{d[0]:10.0f}{a[0]:11.0f}{b[0]:11.0f}{'':12}{a[0] / b[0]:10.2f}")
    for i, name in ((1, "p50"), (2, "p99")):
        print(f"{f'{name} ms, {args.clients} connections':30}{d[i]:10.2f}{a[i]:11.2f}{b[i]:11.2f}{'':12}"
              f"{a[i] / b[i]:10.2f}")
    print(f"{'proxy CPU ms per call':30}{'':10}{a[5]:11.3f}{b[5]:11.3f}{'':12}{a[5] / b[5]:10.2f}")
    if on["fsyncs"]:
        n = sum(on["status"].values())
        print(f"fsync on: {on['fsyncs']:.0f} WAL fsyncs for {n} recorded calls "
              f"({n / on['fsyncs']:.1f} calls per fsync)")
    print(f"load generator: {'wrk' if use_wrk else f'{args.procs} Python aiohttp processes'}; rows by status: "
          f"fsync on {on['status']}, off {off['status']} (abandoned: calls in flight when wrk stopped)")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # still stop the stub and proxy in `finally`
    cpus = _cpus()
    proxy_cpus, other_cpus = ([cpus[0]], cpus[1:]) if len(cpus) > 1 else (None, None)
    tmp = Path(tempfile.mkdtemp(prefix="wharf-bench-proxy-"))
    stub_port = free_port()
    stub = start_stub(stub_port, other_cpus)
    body = chat_body(args.body_bytes, args.stream)
    # The direct run sends what the proxy would: the recording parameters included.
    direct_body = json.loads(body)
    direct_body.update(return_token_ids=True, logprobs=True, top_logprobs=0, temperature=1.0, top_p=1.0)
    if args.stream:
        direct_body["stream_options"] = {"include_usage": True}
    direct_body = json.dumps(direct_body).encode()
    bench = Bench(args, tmp, other_cpus)
    try:
        targets = [(f"http://127.0.0.1:{stub_port}/v1/chat/completions", {"Content-Type": "application/json"},
                    direct_body)] * args.clients
        direct = {"lat": bench.latency(targets),
                  "tp": bench.throughput(targets, f"http://127.0.0.1:{stub_port}", ["/v1/chat/completions"], [""],
                                         direct_body, stub.pid)}
        on = via_proxy(bench, stub_port, body, True, proxy_cpus)
        off = via_proxy(bench, stub_port, body, False, proxy_cpus)
    finally:
        stop(stub)
    report(args, body, direct, on, off, proxy_cpus, other_cpus, bench.use_wrk)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
