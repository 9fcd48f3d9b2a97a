"""Check a collected round against the agents' own records: for every rollout, one turns row per
model call in the agent's own log (collect/agents/logs.py: the minimal agent, mini-swe-agent,
claude-code, codex, ATIF), the same answers, and completion ids that decode to the assistant text.

`python -m collect.audit runs/<run>/rounds/<k>/collect [--tokenizer DIR]` prints one line per
rollout that disagrees and a summary; exit code 1 when any does.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from collect import envdefaults, schema
from collect.agents.logs import compare, read_agent_log
from collect.layout import CollectPaths

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

    @property
    def ok(self) -> bool:
        return not self.problems


def audit_round(collect_dir: str | Path, decode=None, eot: str = "") -> AuditReport:
    """`decode(ids) -> str` decodes completion ids; each must equal the agent's text + `eot`
    (the end-of-turn token is generated, so it is in the ids but not in the message)."""
    paths = CollectPaths(Path(collect_dir))
    rollouts = schema.read_table(paths.rollouts, "rollouts").to_pylist()
    turns = schema.read_dir(paths.turns, "turns").to_pylist()
    by_rollout: dict[str, list[dict]] = {}
    for t in turns:
        by_rollout.setdefault(t["rollout_id"], []).append(t)
    report = AuditReport()
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
        found = compare(rows, log, rid)
        report.problems += found
        if found or decode is None:
            continue
        matched = rows if log.counts_errors else [t for t in rows if t["status"] == "ok"]
        for t, call in zip(matched, log.calls):
            if call.text is None or t["status"] != "ok" or _tool_calls(t):
                continue
            decoded = decode(t["completion_token_ids"])
            if decoded not in (call.text + eot, call.text):
                report.problems.append(
                    f"{rid} turn {t['turn']}: completion ids decode to {decoded[:80]!r}, agent saw {call.text[:80]!r}")
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m collect.audit", description=__doc__.splitlines()[0])
    p.add_argument("collect_dir", help="runs/<run>/rounds/<k>/collect")
    p.add_argument("--tokenizer", help="a HF tokenizer dir to decode completion ids with (default: the embedded model's)")
    args = p.parse_args(argv)
    envdefaults.apply()  # before transformers loads
    from transformers import AutoTokenizer

    from collect.engine.model_store import resolve_model_dir

    tok = AutoTokenizer.from_pretrained(args.tokenizer or resolve_model_dir(None))
    report = audit_round(args.collect_dir, lambda ids: tok.decode(ids), tok.eos_token or "")
    for line in report.problems:
        print(line)
    print(f"audited {report.checked} rollouts ({len(report.skipped)} without a trajectory we read): "
          f"{len(report.problems)} problems")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
