"""Prometheus text exposition for the proxy: counters and one latency histogram, by label set."""
from __future__ import annotations

import bisect
from collections import defaultdict

# Seconds; model calls range from milliseconds (stub) to minutes (long generations).
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


def _labels(pairs: tuple) -> str:
    if not pairs:
        return ""
    inner = ",".join(f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                     for k, v in pairs)
    return "{" + inner + "}"


class Metrics:
    def __init__(self, prefix: str = "wharf_proxy"):
        self.prefix = prefix
        self.counters: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
        self.help: dict[str, str] = {}
        self.hist: dict[tuple, list] = {}  # labels -> [bucket counts..., sum, count]

    def inc(self, name: str, value: float = 1, help: str = "", **labels) -> None:
        if help and name not in self.help:
            self.help[name] = help
        self.counters[name][tuple(sorted(labels.items()))] += value

    def observe(self, seconds: float, **labels) -> None:
        key = tuple(sorted(labels.items()))
        h = self.hist.get(key)
        if h is None:
            h = self.hist[key] = [0] * (len(BUCKETS) + 2)
        i = bisect.bisect_left(BUCKETS, seconds)
        if i < len(BUCKETS):
            h[i] += 1
        h[-2] += seconds
        h[-1] += 1

    def value(self, name: str, **labels) -> float:
        return self.counters.get(name, {}).get(tuple(sorted(labels.items())), 0.0)

    def total(self, name: str) -> float:
        return sum(self.counters.get(name, {}).values())

    def render(self, gauges: dict[str, float] | None = None) -> str:
        out = []
        for name, series in sorted(self.counters.items()):
            full = f"{self.prefix}_{name}"
            if name in self.help:
                out.append(f"# HELP {full} {self.help[name]}")
            out.append(f"# TYPE {full} counter")
            for labels, v in sorted(series.items()):
                out.append(f"{full}{_labels(labels)} {v:g}")
        if self.hist:
            full = f"{self.prefix}_call_seconds"
            out.append(f"# HELP {full} Wall time of a recorded call, agent request to last byte sent")
            out.append(f"# TYPE {full} histogram")
            for labels, h in sorted(self.hist.items()):
                cum = 0
                for b, n in zip(BUCKETS, h):
                    cum += n
                    out.append(f"{full}_bucket{_labels(labels + (('le', f'{b:g}'),))} {cum}")
                out.append(f"{full}_bucket{_labels(labels + (('le', '+Inf'),))} {h[-1]}")
                out.append(f"{full}_sum{_labels(labels)} {h[-2]:.6f}")
                out.append(f"{full}_count{_labels(labels)} {h[-1]}")
        for name, v in sorted((gauges or {}).items()):
            out.append(f"# TYPE {self.prefix}_{name} gauge")
            out.append(f"{self.prefix}_{name} {v:g}")
        return "\n".join(out) + "\n"
