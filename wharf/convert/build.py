"""Jobs read from disk -> training rows with their advantages and weights, and the statistics of
what was used and what was left out (no I/O: stage.py reads and writes).

Which rollouts count: infra_error and verifier_error are not the policy's failures, so they are
left out of group statistics and of training; agent_error, agent_timeout and context_exceeded
are, and keep their reward (a missing one becomes `null_reward`). A context_exceeded rollout
stays in its group but, with `context_exceeded: mask` (the default), its tokens are not trained
(the context limit cut it, not its own choice to stop). A rollout with no ok call has
no policy action to train and is left out too. Groups are qualified by job (`<job_id>/<group_id>`)
so that groups of different jobs never merge when jobs are mixed.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from wharf.convert.advantages import advantages_by_group
from wharf.convert.reader import ConvertInputError, Job
from wharf.convert.rows import Row, RowError, RowOptions, RolloutRows, build_rows

INFRA = ("infra_error", "verifier_error")
# stats.json `rules`: what each rule masked or dropped, from RolloutRows' counters (calls, tokens)
ROW_RULES = {"length_masked": ("masked_length", "masked_length_tokens"),
             "overlong_dropped": ("dropped_overlong", "dropped_overlong_tokens"),
             "truncated": ("truncated_rows", "truncated_tokens"),
             "duplicates_dropped": (None, "duplicate_tokens")}


def _count_rules(rules: dict, built) -> None:
    for rule, (n_attr, tok_attr) in ROW_RULES.items():
        n = len(built.duplicates) if n_attr is None else getattr(built, n_attr)
        if n:
            r = rules.setdefault(rule, Counter())
            r["rollouts"] += 1
            r["count"] += n
            r["tokens"] += getattr(built, tok_attr)


@dataclass
class Built:
    rows: list[Row] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)  # per row
    weights: list[float] = field(default_factory=list)
    rollout_index: list[int] = field(default_factory=list)
    group_index: list[int] = field(default_factory=list)
    rollouts: list[dict] = field(default_factory=list)  # index.json's rollouts (used ones)
    groups: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)


@dataclass
class _Candidate:
    job: Job
    rollout: dict
    group: str
    reward: float
    rows: list[Row]
    built: RolloutRows  # what build_rows masked or dropped (stats' rules)


def _candidates(job: Job, opts: RowOptions, null_reward: float | None, left_out: Counter,
                rstats: Counter, breaks: dict, agents: dict, skip_bad: bool) -> list[_Candidate]:
    out = []
    for r in job.rollouts:
        rid = r["rollout_id"]
        calls = job.calls.get(rid, (0, []))
        if rid in job.bad_rollouts:
            left_out["bad_input"] += 1
            continue
        if r["status"] in INFRA:
            left_out[r["status"]] += 1
            continue
        if not calls[1]:
            left_out["no_turns"] += 1
            continue
        if (r.get("n_turns") or 0) > job.turn_rows[rid]:
            left_out["missing_turns"] += 1  # calls the proxy answered are not in any shard read
            continue
        reward = r["reward"]
        if reward is None:
            if null_reward is None:
                left_out["no_reward"] += 1
                continue
            reward = null_reward
            rstats["null_reward_filled"] += 1
        try:
            built = build_rows(calls[1], opts, rid)
        except RowError as e:
            if not skip_bad:
                raise ConvertInputError(f"{job.files[calls[0]]}: {e}") from None
            job.skipped.append({"file": job.files[calls[0]], "rollout_id": rid, "reason": str(e)})
            left_out["bad_input"] += 1
            continue
        a = agents.setdefault(job.agent, Counter())
        a["pairs"] += len(calls[1]) - len(built.duplicates) - 1
        a["breaks"] += len(built.breaks)
        a["rollouts"] += 1
        if built.breaks:
            breaks[f"{job.job_id}/{rid}"] = built.breaks
        for k in ("truncated_rows", "dropped_overlong", "dropped_empty", "masked_length", "temperature_splits",
                  "repeated_answers", "cut_answers"):
            rstats[k] += getattr(built, k)
        rstats["duplicates"] += len(built.duplicates)
        rstats["calls"] += len(calls[1]) - len(built.duplicates)
        out.append(_Candidate(job, r, f"{job.job_id}/{r['group_id']}", float(reward), built.rows, built))
    return out


def build(jobs: list[Job], opts: RowOptions, estimator: str = "grpo", eps: float = 1e-6,
          null_reward: float | None = 0.0, skip_bad: bool = False) -> Built:
    rstats, breaks, agents, rules = Counter(), {}, {}, {}
    job_left = {j.job_id: Counter() for j in jobs}  # reasons per job; the totals are their sum
    cands = [c for job in jobs
             for c in _candidates(job, opts, null_reward, job_left[job.job_id], rstats, breaks, agents, skip_bad)]
    by_group: dict[str, list[_Candidate]] = {}
    for c in cands:
        by_group.setdefault(c.group, []).append(c)
    kept, dropped = advantages_by_group({g: [c.reward for c in cs] for g, cs in by_group.items()}, estimator, eps)
    out = Built()
    for g in sorted(by_group):
        if g not in kept:
            job_left[by_group[g][0].job.job_id][f"group_{dropped[g]}"] += len(by_group[g])
            continue
        gi = len(out.groups)
        out.groups.append(g)
        for c, adv in zip(by_group[g], kept[g]):
            if c.rollout["status"] == "context_exceeded" and opts.context_exceeded == "mask":
                job_left[c.job.job_id]["context_exceeded_masked"] += 1  # its reward still counted in the group
                r = rules.setdefault("context_exceeded_masked", Counter())
                r["rollouts"] += 1
                r["tokens"] += sum(row.trainable for row in c.rows)
                continue
            _count_rules(rules, c.built)  # rollouts of groups with signal only: what training lost
            if not c.rows:
                job_left[c.job.job_id]["no_rows"] += 1  # every row overlong (dropped) or without a trainable token
                continue
            ri = len(out.rollouts)
            out.rollouts.append({"rollout_id": c.rollout["rollout_id"], "job": c.job.job_id, "dir": str(c.job.dir),
                                 "group_id": g, "task_id": c.rollout["task_id"], "status": c.rollout["status"],
                                 "policy": c.rollout.get("policy"),
                                 "reward": c.reward, "advantage": float(adv), "rows": len(c.rows),
                                 "row_turns": [r.turns for r in c.rows]})  # which calls each row holds
            tokens = sum(row.trainable for row in c.rows)
            for row in c.rows:
                out.rows.append(row)
                out.advantages.append(float(adv))
                out.weights.append(row.trainable / tokens)  # its share of the rollout (records.py)
                out.rollout_index.append(ri)
                out.group_index.append(gi)
    out.stats = _stats(jobs, out, job_left, rstats, breaks, agents, len(kept), Counter(dropped.values()))
    out.stats["rules"] = {k: dict(v) for k, v in sorted(rules.items())}
    return out


def _stats(jobs, out: Built, job_left, rstats, breaks, agents, n_kept, dropped) -> dict:
    left_out = sum(job_left.values(), Counter())
    lengths = np.array([len(r) for r in out.rows], np.int64)
    trainable = sum(r.trainable for r in out.rows)
    n_turns = [len(r.turns) for r in out.rows]
    read = sum(len(j.rollouts) for j in jobs)
    return {
        "rollouts": {"read": read, "used": len(out.rollouts), "left_out": dict(sorted(left_out.items()))},
        "groups": {"used": n_kept, "dropped": dict(dropped)},
        "turns": {"read": sum(j.turns_read for j in jobs), "error": sum(j.turns_error for j in jobs),
                  "abandoned": sum(j.turns_abandoned for j in jobs),
                  "stored_tokens": sum(j.stored_tokens for j in jobs),
                  "used_calls": rstats["calls"], "duplicates_dropped": rstats["duplicates"],
                  "repeated_answers": rstats["repeated_answers"], "cut_answers": rstats["cut_answers"],
                  "orphans": sum(j.orphan_turns for j in jobs),
                  "without_temperature": sum(j.no_temperature for j in jobs)},
        "rows": {"count": len(out.rows), "merged": sum(n > 1 for n in n_turns), "single_call": sum(n == 1 for n in n_turns),
                 "calls_per_row_mean": float(np.mean(n_turns)) if n_turns else 0.0,
                 "rows_per_rollout_mean": len(out.rows) / len(out.rollouts) if out.rollouts else 0.0,
                 "split_rollouts": sum(r["rows"] > 1 for r in out.rollouts),  # used rollouts in several rows
                 "truncated": rstats["truncated_rows"], "dropped_overlong": rstats["dropped_overlong"],
                 "dropped_no_trainable": rstats["dropped_empty"], "length_completions_masked": rstats["masked_length"],
                 "temperature_splits": rstats["temperature_splits"], "null_reward_filled": rstats["null_reward_filled"],
                 "max_len": int(lengths.max()) if len(lengths) else 0},
        "tokens": {"total": int(lengths.sum()), "trainable": trainable},
        "prefix_breaks": {
            "total": sum(len(b) for b in breaks.values()),
            "by_agent": {a: dict(c) for a, c in sorted(agents.items())},
            "by_rollout": breaks,
        },
        "jobs": [{"dir": str(j.dir), "job_id": j.job_id, "agent": j.agent, "rollouts": len(j.rollouts),
                  "used": sum(r["job"] == j.job_id for r in out.rollouts),
                  "left_out": dict(sorted(job_left[j.job_id].items())), "unflushed_wal": j.unflushed_wal,
                  "rows": sum(out.rollouts[i]["job"] == j.job_id for i in out.rollout_index),
                  "groups_used": sum(g.startswith(j.job_id + "/") for g in out.groups),
                  "turn_shards": len(j.files), "orphan_rollouts": j.orphan_rollouts} for j in jobs],
        "skipped": [s for j in jobs for s in j.skipped],
    }
