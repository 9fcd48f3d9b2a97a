"""`wharf report --table RUN_DIR ...`: one markdown row per run, the way docs/warmstart.md tables
its experiment, read from what the runs left (so a rerun's table can be set beside the doc's):

  | run | training reward r0..r4 | cut at max_tokens | mixed groups | held-out policy-v0 | policy-v5 | difference |

then a line per run: pass@k and successes per task family, start policy -> newest, and how many
health checks passed. The held-out figures are the run's last loop evaluation (its eval marker,
and the eval's summary.json for pass@k and successes)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from wharf.core.layout import RunLayout

from .data import RoundData, figure, gather, read_json


def _iv(d: dict) -> str:
    low, high = d.get("low"), d.get("high")
    return figure(d.get("mean")) + ("" if low is None or high is None else f" [{low:.2f}, {high:.2f}]")


def _cut(r: RoundData) -> str:
    return "-" if r.cut_answers is None or not r.used_calls else f"{r.cut_answers}/{r.used_calls}"


def last_heldout(rounds: list[RoundData]) -> RoundData | None:
    """The newest finished round the loop evaluated after."""
    done = [r for r in rounds if r.heldout and not r.partial]
    return done[-1] if done else None


def run_row(label: str, rounds: list[RoundData]) -> str:
    """The run's markdown row (pure): per round, then its last held-out evaluation."""
    done = [r for r in rounds if not r.partial]
    per_round = [" / ".join(fn(r) for r in done) for fn in (
        lambda r: figure(r.mean_reward), _cut, lambda r: figure(r.groups_with_signal, "d"))]
    last = last_heldout(rounds)
    h = last.heldout if last else {}
    held = [_iv(h.get("base") or {}), _iv(h), f"**{_iv(h.get('diff') or {})}**"] if h else ["-", "-", "-"]
    return "| " + " | ".join([label, *per_round, *held]) + " |"


def header(rounds: int) -> list[str]:
    rs = f"r0..r{max(rounds - 1, 0)}"
    cols = ["run", f"training reward {rs}", f"cut at max_tokens {rs}", f"mixed groups {rs}",
            "held-out policy-v0", "held-out newest", "difference"]
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]


def by_family(successes: dict[str, list[int]], families: dict[str, str]) -> dict[str, list[int]]:
    """Task -> [successes, trials] summed per family (a task without one is its own)."""
    out: dict[str, list[int]] = {}
    for task, (c, n) in successes.items():
        acc = out.setdefault(families.get(task, task), [0, 0])
        acc[0], acc[1] = acc[0] + c, acc[1] + n
    return out


def detail_line(label: str, summary: dict, start: str, newest_spec_tail: str, families: dict[str, str]) -> str:
    """pass@k and per-family successes, start -> newest (pure); '' when either is not in the summary."""
    entries = list((summary.get("policies") or {}).values())
    ref = next((e for e in entries if e.get("spec") == start), None)
    new = next((e for e in entries if str(e.get("spec", "")).endswith(newest_spec_tail)), None)
    if ref is None or new is None:
        return ""
    k = str(summary.get("attempts"))
    fa, fb = by_family(ref.get("successes", {}), families), by_family(new.get("successes", {}), families)
    kinds = ", ".join(f"{f} {fa[f][0]}->{fb.get(f, [0])[0]}" for f in sorted(fa))
    return f"{label}: pass@{k} {figure(ref['pass_at'].get(k))} -> {figure(new['pass_at'].get(k))}; successes per family: {kinds}"


def health_text(rounds: list[RoundData]) -> str:
    checks = [c for r in rounds for c in r.health]
    return f"health checks passed: {sum(bool(c.get('ok')) for c in checks)} of {len(checks)}"


def table_lines(run_dirs: list[str], task_families: Callable[[str], dict[str, str]]) -> list[str]:
    """The table, then a detail line per run (I/O: reads the runs); `task_families(dataset)`: task
    -> family, as the eval clusters them."""
    runs = {d: gather(d) for d in run_dirs}
    n = max((sum(not r.partial for r in rs) for rs in runs.values()), default=0)
    lines = header(n) + [run_row(Path(d).name, rs) for d, rs in runs.items()] + [""]
    for d, rs in runs.items():
        last = last_heldout(rs)
        detail = ""
        if last is not None:
            layout = RunLayout(Path(d))
            summary = read_json(layout.eval(last.heldout["eval"]).summary) or {}
            dataset = summary.get("dataset")
            families = task_families(dataset) if dataset else {}
            detail = detail_line(Path(d).name, summary, last.heldout.get("start", "base"),
                                 f"{layout.root.name}:{last.heldout['k']}", families)
        lines.append(f"- {detail or Path(d).name + ': no held-out evaluation yet'}; {health_text(rs)}")
    return lines
