"""`wharf eval`: policies side by side on one task set, with no training.

`wharf eval --config FILE eval.dataset=DIR "eval.policies=[base,runs/R:5]" eval.attempts=4`
(`make eval`). A policy is `base` (the endpoint's model), a run's round `<run dir>:<k>`
(policy-v<k> of that run: the adapter round k-1 trained), or an adapter dir. Every policy runs
the same (task, attempt) trials with the same sampling seeds (collect's seeds of round 0), so two
policies' trials pair up and their difference is paired (wharf/pipeline/eval_stats.py).

Each policy's trials are a normal collect job, written by collect's own round machinery into a
one-round run of its own: runs/<name>/evals/<eval>/<policy>/rounds/0/collect (turns and rollouts
parquet, manifest, harbor trials): replayable, auditable. A policy whose job is finished is not
run again (an interrupted one resumes), and summary.json beside them holds the figures. A run's
round that the run's own loop already evaluated with the same trials (loop.eval_every: the same
split, agent, sampling and seed, at least as many attempts) is read from runs/<run>/evals/, not
run again: GRPO and its control evaluated by their loops compare with no new trial.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from wharf.collect.runner import check_collect, run as collect_round
from wharf.collect.tasksets import TaskSetError, discover
from wharf.core import atomic, schema, storage
from wharf.core.config import ConfigError, RunConfig, cli_config
from wharf.engine.launch import check_endpoint, launch
from wharf.core.endpoint import Endpoint, with_key
from wharf.core.entry import guarded
from wharf.core.errors import WharfError
from wharf.core.replicas import replica_urls
from wharf.core.layout import EvalLayout, RunLayout

from .eval_policy import EvalError, Policy, dataset_of, eval_name, owner_of, resolve, served_digest  # noqa: F401
from .eval_stats import PolicyFigures, Trial, figures, paired_difference
from .eval_stored import legacy_label, stored_note, stored_trials  # noqa: F401  (their old home: eval.py)

log = logging.getLogger("wharf.eval")
UNSCORED = ("infra_error", "verifier_error")  # not the policy's doing: left out, as convert leaves them out


def policy_config(cfg: RunConfig, ev: EvalLayout, p: Policy, served: str, refused: list[str] = ()) -> RunConfig:
    """The collect round of one policy: round 0 of its own run dir under the eval, eval's dataset
    and attempts, every task, sampled from `served` with a fixed seed (0 when sampling.seed is unset),
    none of its calls to the replicas in `refused`. An eval in object storage is named by its URL,
    not this machine's mirror path: a Ray node works in its own mirror and uploads its shards and
    trial logs from there (a path of the driver's mirror is no node's, and no URL's on the node)."""
    collect = dataclasses.replace(cfg.collect, dataset=dataset_of(cfg), tasks=[], attempts=cfg.eval.attempts,
                                  policy=served)
    sampling = dataclasses.replace(cfg.sampling, seed=0 if cfg.sampling.seed is None else cfg.sampling.seed)
    proxy = dataclasses.replace(cfg.proxy, out_dir=None, wal_dir=None,
                                refused={**cfg.proxy.refused, **({served: list(refused)} if refused else {})})
    return dataclasses.replace(cfg, runs_dir=storage.url_of(ev.root) or str(ev.root), name=p.label, round=0, collect=collect,
                               sampling=sampling, proxy=proxy)


@contextmanager
def serving(ep: Endpoint, cfg: RunConfig, p: Policy, owner: str = "") -> Iterator[tuple[str, list[str]]]:
    """`p` served for the block on every replica the proxy routes to (endpoint.url and
    proxy.upstreams: a load reaches only the server that receives it): its adapter loaded under its
    weights' name where it is not (unloaded after: adapter slots are few). Yields the name and the
    replicas that refused it, which the round's proxy routes none of its calls; all refusing is an error."""
    name = p.served_name(cfg.endpoint.model, owner)
    loaded: list[Endpoint] = []
    refused: dict[str, str] = {}
    replicas = replica_urls(ep.url, cfg.proxy.upstreams) if p.adapter is not None else []
    for url in replicas:
        replica = Endpoint(url, ep.api_key, ep.model)
        try:
            if name not in replica.models():
                log.info("loading %s as %s on %s", p.adapter, name, url)
                replica.load_adapter(name, p.adapter)
                loaded.append(replica)
        except WharfError as e:
            refused[url] = str(e)
    try:
        if replicas and len(refused) == len(replicas):
            raise EvalError(f"{p.spec}: no replica serves {p.adapter} as {name!r}: "
                            + "; ".join(f"{u}: {why}" for u, why in refused.items()))
        for url, why in refused.items():
            log.error("eval: replica %s refused %s and gets none of its calls: %s", url, name, why)
        yield name, sorted(refused)
    finally:
        for replica in loaded:
            try:
                replica.unload_adapter(name)
            except WharfError as e:
                log.warning("could not unload %s from %s: %s", name, replica.url, e)


def read_trials(run: RunLayout, attempts: int, families: dict[str, str] | None = None) -> list[Trial]:
    """The scored trials of a policy's collect job, attempts 0..attempts-1 (an earlier call with more
    attempts left more); a policy-side failure without a reward scores 0. `families`: task -> family."""
    rows = schema.read_table(run.round(0).collect.rollouts, "rollouts").to_pylist()
    fam = families or {}
    return [Trial(r["task_id"], r["attempt"], r["reward"] if r["reward"] is not None else 0.0, fam.get(r["task_id"]))
            for r in rows if r["status"] not in UNSCORED and r["attempt"] < attempts]


def unscored(run: RunLayout, attempts: int) -> tuple[dict[str, int], int | None]:
    """Of attempts 0..attempts-1: how many trials read_trials leaves out, by status ({}: no table),
    and the upstream call errors the proxy counted over all of them (None: a table from before
    rollouts.n_errors). Errors are what turns a replica that lost the policy into left-out trials."""
    path = run.round(0).collect.rollouts
    rows = [r for r in (schema.read_table(path, "rollouts").to_pylist() if path.is_file() else [])
            if r["attempt"] < attempts]
    counted = [r["n_errors"] for r in rows if r["n_errors"] is not None]
    errors = sum(counted) if counted or not rows else None
    return dict(Counter(r["status"] for r in rows if r["status"] in UNSCORED)), errors


def task_families(dataset: str | Path) -> dict[str, str]:
    """task -> the `family` its task.toml's [metadata] names (near-copies share one: the interval
    is clustered by it); tasks without one are left out (each is its own cluster)."""
    import tomllib

    out = {}
    for t in discover(dataset):
        try:
            family = tomllib.loads((t.path / "task.toml").read_text()).get("metadata", {}).get("family")
        except (OSError, tomllib.TOMLDecodeError):
            continue
        if isinstance(family, str) and family:
            out[t.task_id] = family
    return out


def evaluate(cfg: RunConfig, policies: list[Policy], ep: Endpoint | None) -> dict:
    """Run every policy's trials (skipping finished jobs, and reading those the policy's run already
    ran: stored_trials) and write the eval's summary.json. `ep` may be None when every policy is stored."""
    ev = cfg.layout.eval(eval_name(cfg))
    cfg = with_key(cfg, ep) if ep is not None else cfg
    results, families = {}, task_families(dataset_of(cfg))
    for p in policies:
        run = stored_trials(cfg, p)
        if run is not None:
            log.info(stored_note(ev, p, run))
        else:
            run = ev.policy(p.label)
            with serving(ep, cfg, p, owner_of(run)) as (served, refused):
                log.info("eval %s: %s (%s) on %s", ev.root.name, p.spec, served, dataset_of(cfg))
                collect_round(policy_config(cfg, ev, p, served, refused))
        results[p.label] = (p, read_trials(run, cfg.eval.attempts, families), run)
    summary = write_summary(ev, cfg, results)
    for label in results:  # counted once, in the summary's entries
        left_out = summary["policies"][label]["unscored"]
        if left_out:
            log.warning("eval %s: %s: %d trials left out, not the policy's doing (%s; %s upstream call errors)",
                        ev.root.name, results[label][0].spec, sum(left_out.values()),
                        ", ".join(f"{s} {n}" for s, n in sorted(left_out.items())),
                        summary["policies"][label]["upstream_errors"])
    return summary


def _interval(iv) -> dict:
    """JSON's null, not NaN, where there is no interval (one task): strict readers refuse NaN."""
    bound = (lambda v: None if math.isnan(v) else v)
    # "tasks" counts the clusters, as it did before families ("clustered_by" says which kind)
    return {"mean": iv.mean, "low": bound(iv.low), "high": bound(iv.high), "tasks": iv.clusters,
            "clustered_by": iv.by}


def _policy_entry(p: Policy, f: PolicyFigures, run: RunLayout, attempts: int) -> dict:
    dropped, errors = unscored(run, attempts)
    return {"spec": p.spec, "label": p.label, "adapter": storage.describe(p.adapter) if p.adapter else None,
            "sha256": p.sha256, "round": p.round, "collect": storage.describe(run.round(0).collect.root),
            "trials": f.trials, "unscored": dropped, "upstream_errors": errors, "reward": _interval(f.reward),
            "pass_at": {str(k): v for k, v in f.pass_at.items()},
            "successes": {t: list(cn) for t, cn in f.successes.items()}}


def write_summary(ev: EvalLayout, cfg: RunConfig, results: dict[str, tuple[Policy, list[Trial], RunLayout]]) -> dict:
    """summary.json: this call's policies (kept beside those of earlier calls into the same eval) and
    each policy's paired difference to the first one of this call."""
    storage.pull_file(ev.summary)  # in object storage: the bucket's, with the policies of earlier calls
    old = json.loads(ev.summary.read_text()) if ev.summary.is_file() else {}
    entries = dict(old.get("policies", {}))
    ks = tuple(range(1, cfg.eval.attempts + 1))
    figs = {label: figures(trials, ks) for label, (_, trials, _) in results.items()}
    for label, (p, _, run) in results.items():
        entries[label] = _policy_entry(p, figs[label], run, cfg.eval.attempts)
    labels = list(results)
    paired = dict(old.get("paired", {}))
    for label in labels[1:]:
        iv, pairs = paired_difference(results[label][1], results[labels[0]][1])
        paired[f"{label} - {labels[0]}"] = {"a": label, "b": labels[0], "pairs": pairs, **_interval(iv)}
    summary = {"dataset": str(dataset_of(cfg)), "attempts": cfg.eval.attempts, "seed": cfg.sampling.seed or 0,
               "last": labels, "policies": entries, "paired": paired}
    atomic.write_json(ev.summary, summary, allow_nan=False)
    storage.push_file(ev.summary)
    return summary


def _iv(d: dict) -> str:
    if d["tasks"] < 2:
        return f"{d['mean']:.3f}"
    return f"{d['mean']:.3f} [{d['low']:.3f}, {d['high']:.3f}]"


def _clustered_by(summary: dict) -> str:
    return "family" if any(e["reward"].get("clustered_by") == "family" for e in summary["policies"].values()) else "task"


def summary_lines(summary: dict) -> list[str]:
    """Per policy of the last call: mean reward with its 95% interval, pass@1 / pass@k, successes per
    task; then the paired differences."""
    lines = [f"eval on {summary['dataset']}: {summary['attempts']} attempts a task, seed {summary['seed']}; "
             f"95% t intervals over per-{_clustered_by(summary)} means"]
    for label in summary["last"]:
        e = summary["policies"][label]
        ks = sorted(int(k) for k in e["pass_at"])
        pk = ", ".join(f"pass@{k} {e['pass_at'][str(k)]:.3f}" for k in ks if k in (1, ks[-1]))
        dropped = e.get("unscored") or {}  # summaries written before it was recorded have none
        left = f" ({sum(dropped.values())} left out: " + ", ".join(f"{s} {n}" for s, n in sorted(dropped.items())) + ")" \
            if dropped else ""
        errors = f"; {e['upstream_errors']} upstream call errors" if e.get("upstream_errors") else ""
        lines.append(f"  {e['spec']}: reward {_iv(e['reward'])} over {e['trials']} trials{left}{errors}; {pk}")
        lines.append("    successes: " + " ".join(f"{t} {c}/{n}" for t, (c, n) in e["successes"].items()))
    for key, d in summary["paired"].items():
        if d["a"] in summary["last"] and d["b"] in summary["last"]:
            a, b = summary["policies"][d["a"]]["spec"], summary["policies"][d["b"]]["spec"]
            lines.append(f"  {a} - {b}: {_iv(d)} (paired by task and attempt, {d['pairs']} pairs)")
    return lines


def main(argv: list[str] | None = None, prog: str = "wharf eval") -> int:
    cfg = cli_config(argv, prog, "Evaluate policies (eval.policies) on a task set (eval.dataset), no training.")
    return guarded(prog, lambda: _eval(cfg))


def _eval(cfg: RunConfig) -> int:
    summary = run_eval(cfg)
    print("\n".join(summary_lines(summary)))
    print(f"eval: {cfg.layout.eval(eval_name(cfg)).summary}")
    return 0


def run_eval(cfg: RunConfig) -> dict:
    """Every policy of eval.policies on the eval's task set; returns summary.json's content."""
    policies = [resolve(s, f"eval.policies[{i}]") for i, s in enumerate(cfg.eval.policies)]  # all, before serving
    try:
        discover(dataset_of(cfg))
    except TaskSetError as e:
        raise ConfigError(f"eval.dataset (collect.dataset when unset): {str(e).removeprefix('collect.dataset: ')}") from None
    labels = [p.label for p in policies]
    if len(set(labels)) < len(labels):
        raise EvalError(f"eval.policies: {cfg.eval.policies} names the same policy twice ({labels})")
    if all(stored_trials(cfg, p) for p in policies):  # nothing to sample: no endpoint to start
        summary = evaluate(cfg, policies, None)
    else:
        check_collect(dataclasses.replace(cfg, collect=dataclasses.replace(cfg.collect, dataset=dataset_of(cfg), tasks=[])))
        check_endpoint(cfg)  # the agent and environment classes, then the endpoint: before anything is written
        with launch(cfg, log_dir=cfg.layout.eval(eval_name(cfg)).root / "logs") as ep:
            summary = evaluate(cfg, policies, ep)
    return summary
