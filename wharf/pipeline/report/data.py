"""What the run report shows, gathered from a run dir: one record per round, read defensively.

Each stage's own outputs are the sources (collect's manifest.json, rollouts.parquet and turns,
convert's stats.json, train's metrics.jsonl and result.json, the loop's stage markers); a
missing or unreadable file leaves its fields None, so a report can be written after any stage
of any round, and for a replay run that has no collect dirs of its own.
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from wharf.train.records import TrainResult
from wharf.core import schema
from wharf.core.layout import RoundLayout, RunLayout

log = logging.getLogger("wharf.report")

STAGES = ("collect", "convert", "train", "publish")


@dataclass
class RoundData:
    k: int
    partial: bool = False  # collect still running (or killed mid-round): rewards of the trials so far
    policy: str | None = None
    rollouts: int = 0
    mean_reward: float | None = None
    success_rate: float | None = None
    success_by_task: dict[str, float] = field(default_factory=dict)
    successes: int | None = None  # rollouts with reward > 0
    multi_call_successes: int | None = None  # of those, the ones that took >= 2 model calls
    groups: int | None = None  # groups in the round
    groups_with_signal: int | None = None  # groups with both a success and a failure
    groups_used: int | None = None  # groups convert kept
    response_tokens: float | None = None  # mean completion tokens per call
    call_lengths: list[int] = field(default_factory=list)  # completion tokens of each call
    prefix_cache_hit_rate: float | None = None  # the endpoints' prompt tokens served from their prefix cache
    calls: int | None = None
    prefix_breaks: int | None = None
    rows: int | None = None
    rows_per_rollout: float | None = None  # convert's rows per used rollout (> 1: split at prefix breaks)
    call_pairs: int | None = None  # consecutive call pairs convert looked at for prefix breaks
    repeated_answers: int | None = None  # calls whose answer repeats the previous one token for token
    cut_answers: int | None = None  # calls cut at max_tokens (finish_reason length)
    used_calls: int | None = None
    trainable_tokens: int | None = None
    rules: dict[str, dict] = field(default_factory=dict)  # convert's stats `rules`: rule -> rollouts, tokens
    steps: list[dict] = field(default_factory=list)  # train's metrics.jsonl lines
    mismatch_mean: float | None = None  # first step: |trainer - endpoint| log-prob per token
    mismatch_max: float | None = None
    walls: dict[str, float] = field(default_factory=dict)  # stage -> seconds
    jobs: list[dict] = field(default_factory=list)  # replay: off-policy statistics per job
    shift: dict = field(default_factory=dict)  # wharf/train/shift.py: the update's |delta log-prob|, KL
    health: list[dict] = field(default_factory=list)  # wharf/pipeline/health.py: the loop's checks
    # The loop's held-out evaluation after this round (its eval marker): policy-v<k+1>'s reward
    # (mean, low, high, k), the base's, and their paired difference.
    heldout: dict = field(default_factory=dict)
    # Overlapping rounds (loop.max_staleness): the rows' lag behind the policy trained, the
    # importance weights that corrected it, and what each half waited for the other.
    overlap: dict = field(default_factory=dict)

    def step_mean(self, key: str) -> float | None:
        vals = [s[key] for s in self.steps if _num(s.get(key))]
        return sum(vals) / len(vals) if vals else None


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("report: %s is unreadable (%s); left out", path, e)
        return None


def read_jsonl(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill: the step is redone on resume
    return out


def _rollouts(rnd: RoundLayout) -> list[dict]:
    if not rnd.collect.rollouts.is_file():
        return []
    try:
        return schema.read_table(rnd.collect.rollouts, "rollouts").select(
            ["task_id", "group_id", "reward", "policy", "n_turns"]).to_pylist()
    except Exception as e:  # a report never stops the loop
        log.warning("report: %s: %s", rnd.collect.rollouts, e)
        return []


def _turn_lengths(rnd: RoundLayout) -> list[int]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    lengths: list[int] = []
    for f in schema.shard_files(rnd.collect.turns):
        try:
            col = pq.read_table(f, columns=["completion_token_ids"])["completion_token_ids"]
            lengths += pc.list_value_length(col).fill_null(0).to_pylist()
        except Exception as e:
            log.warning("report: %s: %s", f, e)
    return lengths


def collect_fields(rd: RoundData, rnd: RoundLayout) -> None:
    manifest = read_json(rnd.collect.manifest) or {}
    rows = _rollouts(rnd)
    rd.partial = manifest.get("state") == "running"
    rd.policy = manifest.get("policy") or (rows[0]["policy"] if rows else None)
    rewards = [r["reward"] for r in rows if r["reward"] is not None]
    rd.rollouts = len(rows)
    if rewards:
        rd.mean_reward = sum(rewards) / len(rewards)
        rd.success_rate = sum(r > 0 for r in rewards) / len(rewards)
        won = [r for r in rows if (r["reward"] or 0) > 0]
        rd.successes, rd.multi_call_successes = len(won), sum((r["n_turns"] or 0) >= 2 for r in won)
    by_task: dict[str, list[float]] = {}
    by_group: dict[str, set] = {}
    for r in rows:
        by_task.setdefault(r["task_id"], []).append(1.0 if (r["reward"] or 0) > 0 else 0.0)
        if r["reward"] is not None:
            by_group.setdefault(r["group_id"], set()).add(r["reward"])
    rd.success_by_task = {t: sum(v) / len(v) for t, v in sorted(by_task.items())}
    if rows:
        rd.groups = len(by_group)
        rd.groups_with_signal = sum(len(v) > 1 for v in by_group.values())
    lengths = _turn_lengths(rnd)
    if lengths:
        rd.calls, rd.response_tokens = len(lengths), sum(lengths) / len(lengths)
        rd.call_lengths = lengths
    rd.prefix_cache_hit_rate = _get(manifest, "prefix_cache", "hit_rate")
    if _num(manifest.get("wall_s")):
        rd.walls["collect"] = manifest["wall_s"]


def convert_fields(rd: RoundData, stats: dict | None) -> None:
    if not stats:
        return
    rd.groups_used = _get(stats, "groups", "used")
    rd.prefix_breaks = _get(stats, "prefix_breaks", "total")
    rd.repeated_answers = _get(stats, "turns", "repeated_answers")
    rd.cut_answers = _get(stats, "turns", "cut_answers")
    rd.used_calls = _get(stats, "turns", "used_calls")
    rd.rows = _get(stats, "rows", "count")
    rd.rows_per_rollout = _get(stats, "rows", "rows_per_rollout_mean")
    rd.trainable_tokens = _get(stats, "tokens", "trainable")
    by_agent = _get_dict(stats, "prefix_breaks", "by_agent")
    if by_agent:
        rd.call_pairs = sum(int(c.get("pairs", 0)) for c in by_agent.values() if isinstance(c, dict))
    rd.rules = stats.get("rules") if isinstance(stats.get("rules"), dict) else {}
    if _num(stats.get("wall_s")):
        rd.walls["convert"] = stats["wall_s"]


def train_fields(rd: RoundData, rnd: RoundLayout) -> None:
    rd.steps = read_jsonl(rnd.train.metrics)
    result = read_result(rnd.train.result)
    first = next((s for s in rd.steps if _num(s.get("mismatch_mean"))), {})
    rd.mismatch_mean = result.mismatch_mean if result else first.get("mismatch_mean")
    rd.mismatch_max = result.mismatch_max if result else first.get("mismatch_max")
    if result and _num(result.wall_s):
        rd.walls["train"] = result.wall_s
    rd.shift = read_json(rnd.train.shift) or {}
    off = read_json(rnd.train.offpolicy)
    if off:
        rd.jobs = off.get("jobs", [])


def read_result(path: Path) -> TrainResult | None:
    """train's result.json as its record; None when the round is not trained (or the file is bad)."""
    try:
        return TrainResult.read(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as e:
        log.warning("report: %s is unreadable (%s); left out", path, e)
        return None


def _get(d: dict, *keys):
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d if _num(d) else None


def _get_dict(d: dict, *keys) -> dict:
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d if isinstance(d, dict) else {}


def marker_walls(rd: RoundData, rnd: RoundLayout) -> None:
    """The loop's stage markers hold the wall time of each stage as the loop saw it."""
    for stage in STAGES:
        m = read_json(rnd.marker(stage))
        if m and _num(m.get("wall_s")):
            rd.walls[stage] = m["wall_s"]


def gather_round(layout: RunLayout, k: int) -> RoundData:
    rnd = layout.round(k)
    rd = RoundData(k)
    collect_fields(rd, rnd)
    convert_fields(rd, read_json(rnd.convert.stats))
    train_fields(rd, rnd)
    marker_walls(rd, rnd)
    health = read_json(rnd.health) if rnd.health.is_file() else None
    rd.health = health if isinstance(health, list) else []
    overlap_fields(rd, rnd)
    heldout = read_json(rnd.marker("eval"))
    rd.heldout = heldout if isinstance(heldout, dict) and _num(heldout.get("mean")) and _num(heldout.get("k")) else {}
    return rd


def overlap_fields(rd: RoundData, rnd: RoundLayout) -> None:
    """From the collect marker an overlapping loop writes (lag, waited_s), convert's marker
    (waited_for_collect_s) and train's steps (is_weight_mean, is_capped, token-weighted)."""
    c, v = read_json(rnd.marker("collect")) or {}, read_json(rnd.marker("convert")) or {}
    if not _num(c.get("lag")):
        return
    tok = [(s.get("loss_tokens") or 0, s) for s in rd.steps if _num(s.get("is_weight_mean"))]
    n = sum(t for t, _ in tok)
    rd.overlap = {"lag": c["lag"], "collect_waited_s": c.get("waited_s"), "mismatch": rd.mismatch_mean,
                  "train_waited_s": v.get("waited_for_collect_s"),
                  "is_weight_mean": sum(t * s["is_weight_mean"] for t, s in tok) / n if n else None,
                  "is_capped": sum(t * s["is_capped"] for t, s in tok) / n if n else None}


def gather_evals(layout: RunLayout) -> list[tuple[str, dict]]:
    """(eval name, summary.json) of every evaluation under the run's evals/ (`wharf eval`, the loop)."""
    if not layout.evals.is_dir():
        return []
    found = [(d.name, read_json(layout.eval(d.name).summary)) for d in sorted(layout.evals.iterdir())]
    return [(name, s) for name, s in found if isinstance(s, dict) and isinstance(s.get("policies"), dict)]


def gather(run_dir: str | Path) -> list[RoundData]:
    layout = RunLayout(Path(run_dir))
    return [gather_round(layout, k) for k in layout.rounds()]


def figure(v, fmt: str = ".3f") -> str:
    """`v` formatted, or "-" where the figure is missing."""
    return "-" if v is None else format(v, fmt)


def round_line(rd: RoundData) -> str:
    """The round's figures in one line (the loop prints it after every round): what the
    experiment compares between runs."""
    calls = rd.calls / rd.rollouts if rd.calls and rd.rollouts else None
    breaks = rd.prefix_breaks / rd.call_pairs if rd.prefix_breaks is not None and rd.call_pairs else None
    repeats = rd.repeated_answers / rd.used_calls if rd.repeated_answers is not None and rd.used_calls else None
    cut = rd.cut_answers / rd.used_calls if rd.cut_answers is not None and rd.used_calls else None
    return (f"round {rd.k} ({rd.policy}): mean reward {figure(rd.mean_reward)}, success {figure(rd.success_rate)}, "
            f"calls/rollout {figure(calls, '.2f')}, rows/rollout {figure(rd.rows_per_rollout, '.2f')}, "
            f"prefix breaks {figure(rd.prefix_breaks, 'd')}/{figure(rd.call_pairs, 'd')} pairs ({figure(breaks, '.0%')}), "
            f"repeated answers {figure(rd.repeated_answers, 'd')}/{figure(rd.used_calls, 'd')} calls ({figure(repeats, '.0%')}), "
            f"cut at max_tokens {figure(rd.cut_answers, 'd')}/{figure(rd.used_calls, 'd')} ({figure(cut, '.0%')}), "
            f"trainable tokens {figure(rd.trainable_tokens, 'd')}, |delta log-prob| {figure(rd.shift.get('delta_mean'), '.3g')}, "
            f"KL to previous {figure(rd.shift.get('kl'), '.3g')}, "
            f"successes in >= 2 calls {figure(rd.multi_call_successes, 'd')}/{figure(rd.successes, 'd')}"
            + overlap_text(rd.overlap) + heldout_text(rd.heldout))


def overlap_text(o: dict) -> str:
    """'; lag 1, |log-ratio| 0.099, importance weight 0.98 (2% capped), waited: collect 0 s, train 12 s',
    or ''. |log-ratio|: train's first-step mean |log pi_start - log pi_behaviour|, the gap the
    weights correct (their mean is ~1 by construction)."""
    if not o:
        return ""
    capped = f" ({o['is_capped']:.0%} capped)" if _num(o.get("is_capped")) else ""
    return (f"; lag {o['lag']}, |log-ratio| {figure(o.get('mismatch'))}, importance weight "
            f"{figure(o.get('is_weight_mean'))}{capped}, waited: collect "
            f"{figure(o.get('collect_waited_s'), '.0f')} s, train {figure(o.get('train_waited_s'), '.0f')} s")


def heldout_text(h: dict) -> str:
    """'; held-out (policy-v<k>): 0.41 [0.22, 0.60], base 0.16, difference 0.25 [0.05, 0.45]', or ''."""
    if not h:
        return ""
    def iv(d: dict) -> str:
        ok = _num(d.get("low")) and _num(d.get("high"))
        return f"{figure(d.get('mean'))}" + (f" [{figure(d['low'])}, {figure(d['high'])}]" if ok else "")
    start = "base" if h.get("start", "base") == "base" else "policy-v0"  # a warm start's init adapter
    return (f"; held-out ({h.get('policy')}): {iv(h)}, {start} {iv(h.get('base') or {})}, "
            f"difference {iv(h.get('diff') or {})}")
