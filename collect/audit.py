"""Check a collected round against the agents' own records: for every rollout, one turns row per
model call in the agent's trajectory, and completion ids that decode to the assistant text.

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
from collect.layout import CollectPaths

# Where agents keep their own record of the conversation, relative to the trial's agent/ dir.
_MINIMAL = "trajectory.json"  # collect.agents.minimal (format wharf-minimal/1)
_MINI_SWE = "mini-swe-agent.trajectory.json"  # mini-swe-agent's native trajectory


def assistant_texts(agent_dir: Path) -> list[str] | None:
    """The assistant messages an agent recorded, in call order; None when it left no record we read."""
    native = agent_dir / _MINI_SWE
    if native.is_file():
        # Every model call leaves its raw response in some message's `extra`: on the assistant
        # message, or on the user message that rejected a malformed or cut-off answer.
        texts = []
        for m in json.loads(native.read_text()).get("messages", []):
            response = (m.get("extra") or {}).get("response")
            if isinstance(response, dict) and response.get("choices"):
                texts.append(response["choices"][0]["message"].get("content") or "")
            elif m.get("role") == "assistant":
                texts.append(m.get("content") or "")
        return texts
    own = agent_dir / _MINIMAL
    if own.is_file():
        data = json.loads(own.read_text())
        if isinstance(data, dict) and "calls" in data:
            # a call that failed has no assistant text, but it reached the proxy: keep its place
            return [c.get("assistant") for c in data["calls"]]
        if isinstance(data, list):  # a flat list of {assistant: ...} (test agents)
            return [c.get("assistant") for c in data]
    return None


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
        texts = assistant_texts(paths.root / r["trial_dir"] / "agent")
        if texts is None:
            report.skipped.append(rid)
            continue
        report.checked += 1
        rows = sorted(by_rollout.get(rid, []), key=lambda t: t["turn"])
        if [t["turn"] for t in rows] != list(range(len(rows))):
            report.problems.append(f"{rid}: turn numbers {[t['turn'] for t in rows]} are not 0..n-1")
        if len(rows) != len(texts):
            report.problems.append(f"{rid}: {len(rows)} turns rows but {len(texts)} model calls in the agent's trajectory")
            continue
        if r["n_turns"] != len(rows):
            report.problems.append(f"{rid}: rollouts.n_turns={r['n_turns']} but {len(rows)} turns rows")
        for t, text in zip(rows, texts):
            if text is None or t["status"] != "ok":
                continue
            content = json.loads(t["response"])["choices"][0]["message"].get("content") or ""
            if content != text:
                report.problems.append(f"{rid} turn {t['turn']}: recorded response differs from the agent's text")
            if decode is not None:
                decoded = decode(t["completion_token_ids"])
                if decoded not in (text + eot, text):
                    report.problems.append(
                        f"{rid} turn {t['turn']}: completion ids decode to {decoded[:80]!r}, agent saw {text[:80]!r}")
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
