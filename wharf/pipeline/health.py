"""The loop's health checks: after every round, is the loop really learning anything?

A loop that trains nothing fails quietly (an adapter that never reached the endpoint, a round
with no trainable token, every rollout an infra error), so after each round the loop gathers a
few facts from what the stages wrote (`gather`, the I/O edge), checks them (`run_checks`, pure,
in wharf/pipeline/health_checks.py), writes rounds/<k>/health.json (the report's table) and stops when
a check fails, naming the round, what was expected, what was seen and the file it was read from.
Each check has a key under `loop.health` that relaxes it (wharf/core/config_loop.py's HealthConfig).
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from wharf.core import atomic, schema
from wharf.core.config import HealthConfig
from wharf.core.errors import WharfError
from wharf.core.layout import RoundLayout, RunLayout, policy_name
from wharf.core.replicas import PublishRecord

from .health_checks import HealthCheck, RoundFacts, run_checks
from .report.data import read_result


class HealthError(WharfError, RuntimeError):
    """A round failed a health check; the message says which, what was seen, and how to relax it."""


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _turns(rnd: RoundLayout) -> tuple[Counter, Counter, Counter]:
    """Turns by policy, by status, by finish_reason (a bad shard: one line naming it)."""
    pol, status, finish = Counter(), Counter(), Counter()
    for shard in schema.shard_files(rnd.collect.turns):
        t = schema.read_table(shard, "turns", ["policy", "status", "finish_reason"])
        pol.update(t["policy"].to_pylist())
        status.update(t["status"].to_pylist())
        finish.update(t["finish_reason"].to_pylist())
    return pol, status, finish


def _cut(finish: Counter) -> tuple[int, int]:
    return finish.get("length", 0), sum(n for reason, n in finish.items() if reason)


def _timeouts(rnd: RoundLayout) -> tuple[int, int] | None:
    """(rollouts that ran out of time, rollouts) of the round; None where no rollouts table."""
    if not rnd.collect.rollouts.is_file():
        return None
    status = schema.read_table(rnd.collect.rollouts, "rollouts", ["status"])["status"].to_pylist()
    return status.count("agent_timeout"), len(status)


def gather(rnd: RoundLayout, policy: str, allowed: tuple[str, ...] = (),
           live: dict[str, str] | None = None) -> RoundFacts:
    """The facts of round `rnd`, which `policy` should have sampled (missing files leave None),
    or any of `allowed`. `live`: {url: why} of the replicas found not serving the published policy
    when asked just now (None: not asked; the publish record answers)."""
    lag = (_json(rnd.marker("collect")) or {}).get("lag")
    f = RoundFacts(rnd.k, policy, allowed, lag if isinstance(lag, int) else 0)
    pol, status, finish = _turns(rnd)
    f.turn_policies, f.turn_status, f.cut = dict(pol), dict(status), _cut(finish)
    f.files["turns"] = str(rnd.collect.turns)
    first = RunLayout(rnd.root.parents[1]).round(0)
    if rnd.k > 0 and first.collect.turns.is_dir():
        f.start_cut = _cut(_turns(first)[2])
    f.timeouts, f.files["rollouts"] = _timeouts(rnd) or (0, 0), str(rnd.collect.rollouts)
    f.start_timeouts = _timeouts(first) if rnd.k > 0 else None
    f.files["convert"] = str(rnd.convert.stats)
    stats = _json(rnd.convert.stats) or {}
    if stats:
        f.loss_tokens = (stats.get("tokens") or {}).get("trainable")
        ro = stats.get("rollouts") or {}
        f.rollouts_read = ro.get("read")
        f.left_out = {k: v for k, v in (ro.get("left_out") or {}).items() if not k.startswith("group_")}
    result = read_result(rnd.train.result)
    f.served_mismatch = result.mismatch_mean if result else None
    f.carried = bool((_json(rnd.marker("train")) or {}).get("carried"))
    f.shift = _json(rnd.train.shift)
    f.files["shift"] = str(rnd.train.shift)
    f.files["metrics"] = str(rnd.train.metrics)
    for line in (rnd.train.metrics.read_text().splitlines() if rnd.train.metrics.is_file() else []):
        try:
            step = json.loads(line)
        except ValueError:
            continue  # a line cut by a kill
        f.steps.append(step)
    _published(f, rnd, live)
    return f


def published_name(rnd: RoundLayout) -> str:
    """The name round k's policy was published under: its publish marker's (a run from before
    per-run names: `policy-v<k+1>`), else the run's (wharf/core/names.py)."""
    name = (_json(rnd.marker("publish")) or {}).get("policy")
    if isinstance(name, str) and name:
        return name
    run = RunLayout(rnd.root.parents[1])
    old = policy_name(rnd.k + 1)
    return old if run.published(old).is_file() and not run.published(run.policy(rnd.k + 1)).is_file() \
        else run.policy(rnd.k + 1)


def _published(f: RoundFacts, rnd: RoundLayout, live: dict[str, str] | None) -> None:
    name = published_name(rnd)
    path = RunLayout(rnd.root.parents[1]).published(name)
    f.files["published"] = str(path)
    try:
        record = PublishRecord.read(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        f.published, f.refused = name, {"?": f"unreadable record: {e}"}
        return
    if live is not None:  # what the replicas serve now wins over what publish once recorded
        f.published, f.refused = name, dict(live)
        f.files["published"] = f"GET /v1/models on every replica; {path}"
        for url, why in (record.refused if record else {}).items():
            if url in f.refused:
                f.refused[url] += f"; at publish: {why}"
    elif record is not None:
        f.published, f.refused = record.policy, record.refused


def check_round(rnd: RoundLayout, policy: str, cfg: HealthConfig, allowed: tuple[str, ...] = (),
                live: dict[str, str] | None = None) -> list[HealthCheck]:
    """Gather, check, and write rounds/<k>/health.json (atomically); returns the checks. `allowed`:
    the other policies that may have sampled the round (overlapping rounds); `live`: see gather."""
    checks = run_checks(gather(rnd, policy, allowed, live), cfg)
    atomic.write_json(rnd.health, [asdict(c) for c in checks])
    return checks


def enforce(checks: list[HealthCheck]) -> None:
    failed = [c for c in checks if not c.ok]
    if failed:
        raise HealthError("\n".join(c.message() for c in failed))
