"""Check a collected round against the agents' own records: for every rollout, one turns row per
model call in the agent's own log (wharf/collect/agents/logs.py: the minimal agent, mini-swe-agent,
claude-code, codex, ATIF), the same answers, and completion ids that decode to the assistant text.
Calls recorded as `abandoned` (the agent hung up before the answer) are not in the agent's log and
are left out of that comparison. Turns of rollouts missing from the rollouts table (orphans: trials
of a killed round that never finished) are counted, not compared; convert ignores them.

`wharf audit runs/<run>/rounds/<k>/collect [--tokenizer DIR]` prints one line per
rollout that disagrees and a summary; exit code 1 when any does.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from wharf.collect.agents.logs import compare, read_agent_log
from wharf.core import envdefaults, schema
from wharf.core.entry import ArgParser, guarded
from wharf.core.errors import UsageError
from wharf.core.layout import CollectPaths
from wharf.core.model_store import resolve_model_dir

def _tool_calls(row: dict) -> bool:
    """Whether the recorded answer holds a tool call (its ids then decode to more than the text)."""
    resp = json.loads(row["response"]) if row.get("response") else {}
    if row["api"] == "anthropic":
        return any(b.get("type") == "tool_use" for b in resp.get("content") or ())
    if row["api"] == "responses":
        return any(it.get("type") != "message" for it in resp.get("output") or ())
    return bool(((resp.get("choices") or [{}])[0].get("message") or {}).get("tool_calls"))


@dataclass
class AuditReport:
    checked: int = 0
    skipped: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    orphan_turns: dict[str, int] = field(default_factory=dict)  # rollout id (not in the table) -> turns rows
    abandoned: int = 0  # turns rows of calls the agent hung up on

    @property
    def ok(self) -> bool:
        return not self.problems


def orphans(turn_rollout_ids: Iterable[str], known: set[str]) -> dict[str, int]:
    """Turns rows per rollout id that the rollouts table does not hold."""
    return dict(Counter(rid for rid in turn_rollout_ids if rid not in known))


def orphan_turns(paths: CollectPaths) -> dict[str, int]:
    """orphans() of a collect dir, reading only the rollout_id column of each shard (for manifest.json)."""
    known = {r for r in schema.read_table(paths.rollouts, "rollouts", ["rollout_id"]).column(0).to_pylist()} \
        if paths.rollouts.exists() else set()
    ids = (rid for f in schema.shard_files(paths.turns)
           for rid in schema.read_table(f, "turns", ["rollout_id"]).column(0).to_pylist())
    return orphans(ids, known)


def text_only_rollouts(paths: CollectPaths) -> list[str]:
    """Rollouts with a text-only call (a teacher without token ids, or imported): SFT rows only."""
    found: set[str] = set()
    for f in schema.shard_files(paths.turns):
        t = schema.read_table(f, "turns", ["rollout_id", "text_only"]).to_pydict()
        found.update(r for r, text in zip(t["rollout_id"], t["text_only"]) if text)
    return sorted(found)


def audit_round(collect_dir: str | Path, decode=None, eot: str = "") -> AuditReport:
    """`decode(ids) -> str` decodes completion ids; each must equal the agent's text + `eot`
    (the end-of-turn token is generated, so it is in the ids but not in the message)."""
    paths = CollectPaths(Path(collect_dir))
    rollouts = schema.read_table(paths.rollouts, "rollouts").to_pylist()
    turns = schema.read_dir(paths.turns, "turns").to_pylist()
    by_rollout: dict[str, list[dict]] = {}
    for t in turns:
        by_rollout.setdefault(t["rollout_id"], []).append(t)
    report = AuditReport(orphan_turns=orphans((t["rollout_id"] for t in turns), {r["rollout_id"] for r in rollouts}),
                         abandoned=sum(t["status"] == "abandoned" for t in turns))
    for r in rollouts:
        rid = r["rollout_id"]
        log = read_agent_log(paths.root / r["trial_dir"] / "agent")
        if log is None:
            report.skipped.append(rid)
            continue
        report.checked += 1
        rows = sorted(by_rollout.get(rid, []), key=lambda t: t["turn"])
        if [t["turn"] for t in rows] != list(range(len(rows))):
            report.problems.append(f"{rid}: turn numbers {[t['turn'] for t in rows]} are not 0..n-1")
        if r["n_turns"] != len(rows):
            report.problems.append(f"{rid}: rollouts.n_turns={r['n_turns']} but {len(rows)} turns rows")
        found = compare([t for t in rows if t["status"] != "abandoned"], log, rid)
        report.problems += found
        if found or decode is None:
            continue
        matched = [t for t in rows if t["status"] == "ok" or (log.counts_errors and t["status"] == "error")]
        for t, call in zip(matched, log.calls):
            if call.text is None or t["status"] != "ok" or _tool_calls(t) or t.get("text_only"):  # no ids
                continue
            decoded = decode(t["completion_token_ids"])
            if decoded not in (call.text + eot, call.text):
                report.problems.append(
                    f"{rid} turn {t['turn']}: completion ids decode to {decoded[:80]!r}, agent saw {call.text[:80]!r}")
    return report


def main(argv: list[str] | None = None, prog: str = "wharf audit") -> int:
    p = ArgParser(prog=prog, description=(
        "Check a collected round against the agents' own records: one turns row per model call in each agent's "
        "log, the same answers, and completion ids that decode to the assistant text. Exit code 1 when a "
        "rollout disagrees."))
    p.add_argument("collect_dir", help="runs/<run>/rounds/<k>/collect")
    p.add_argument("--tokenizer", help="a HF tokenizer dir to decode completion ids with (default: the embedded model's)")
    args = p.parse_args(argv)
    return guarded(prog, lambda: _audit(args))


def check_args(collect_dir: str, tokenizer: str | None) -> None:
    """The cheap checks first: a collect dir, and a tokenizer dir, before transformers loads."""
    paths = CollectPaths(Path(collect_dir))
    if not paths.rollouts.is_file():
        raise UsageError(f"{collect_dir}: not a collect dir (no rollouts.parquet): name a "
                         "runs/<run>/rounds/<k>/collect dir")
    if tokenizer is not None and not (Path(tokenizer) / "tokenizer_config.json").is_file():
        raise UsageError(f"--tokenizer {tokenizer}: not a Hugging Face tokenizer dir (no tokenizer_config.json)")


def _audit(args) -> int:
    check_args(args.collect_dir, args.tokenizer)
    envdefaults.apply()  # before transformers loads (`python -m wharf.collect.audit` comes here first)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.tokenizer or resolve_model_dir(None))
    report = audit_round(args.collect_dir, lambda ids: tok.decode(ids), tok.eos_token or "")
    for line in report.problems:
        print(line)
    for rid, n in sorted(report.orphan_turns.items()):
        print(f"{rid}: {n} orphan turns rows (no such rollout in rollouts.parquet; convert ignores them)")
    print(f"audited {report.checked} rollouts ({len(report.skipped)} without a trajectory we read): "
          f"{len(report.problems)} problems; {sum(report.orphan_turns.values())} orphan turns rows "
          f"in {len(report.orphan_turns)} rollouts; {report.abandoned} abandoned calls")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
