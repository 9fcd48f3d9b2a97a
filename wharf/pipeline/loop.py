"""The RL loop: for k = 0..rounds-1, collect round k from policy-v<k> (round 0: the base model, or
with loop.init_adapter, a warm start, that adapter as policy-v0, which round 0's train continues),
convert it, train it, publish policy-v<k+1>; the run report is rewritten after every round.

`wharf loop --config FILE [key=value ...]` (`make loop ROUNDS=N`: `rounds=N`).

Resumable: each finished stage leaves a marker (wharf/pipeline/stages.py); run again after a kill
anywhere, the loop skips the marked stages and resumes the one it was in (collect keeps its
finished rollouts, convert is atomic, train restarts from its last checkpoint). A larger `rounds`
continues a finished loop. The endpoint is started once for the whole loop when `endpoint.launch`
is set and nothing answers (and stopped when the loop ends); before each round samples, the loop
makes sure the endpoint serves that round's policy, loading the adapter again after an endpoint
restart. With `loop.eval_every: N`, every N rounds the policy just published (and the base model,
once) is evaluated on `loop.eval_dataset` (wharf/pipeline/eval.py, into runs/<run>/evals/), and the
round's line and the report show the held-out reward beside the training reward. After each
round the loop's health checks (wharf/pipeline/health.py) run and stop the loop,
naming what failed, when it is not learning. With `loop.max_staleness: s >= 1` round k+1 is
collected while round k trains, from the newest published policy (wharf/pipeline/overlap.py).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter

from wharf.collect.runner import run as collect_round
from wharf.engine.launch import launch
from wharf.train.model import base_model_dir
from wharf.train.publish import publish
from wharf.train.shift import measure, write
from wharf.train.stage import convert_dir
from wharf.core import lease, storage
from wharf.core.config import RunConfig, cli_config, dump_config
from wharf.core.endpoint import Endpoint, with_key
from wharf.core.entry import guarded
from wharf.core.layout import ConvertPaths, RunLayout, has_adapter, init_adapter_dir
from wharf.core.names import policy_name
from wharf.core.model_identity import check_served
from wharf.core.model_store import release_memory
from wharf.core.replicas import not_serving, replica_urls

from .eval import eval_name, evaluate, resolve
from .health import check_round, enforce, published_name
from .loop_checks import check_init_adapter, check_loop  # noqa: F401  (check_init_adapter: its old home)
from .overlap import Collector, allowed_policies, check_lag, recorded_policy, served_name
from .report.data import gather_round, round_line
from .stages import (LoopError, convert_stage, forget_old_weights, read_marker, round_index, run_stage, track_round,
                     train_stage, write_report)

log = logging.getLogger("wharf.loop")


def round_config(cfg: RunConfig, k: int, policy: str | None = None) -> RunConfig:
    """Round k's config: sample from `policy`, by default policy-v<k> (round 0: the base model);
    the loop publishes."""
    policy = policy or recorded_policy(cfg, k) or (cfg.start_policy if k == 0 else cfg.policy(k))
    train = dataclasses.replace(cfg.train, publish=False)
    return dataclasses.replace(cfg, round=k, collect=dataclasses.replace(cfg.collect, policy=policy), train=train)


def ensure_served(ep: Endpoint | None, cfg: RunConfig, k: int) -> None:
    """Before a round samples from policy-v<k>: every replica the proxy routes to must serve it,
    from this run's adapter (a replica that restarted has forgotten its runtime adapters: load
    round k-1's again there; policy-v0 is loop.init_adapter's; a replica serving another run's
    policy-v<k> is refused by publish, recorded, and routed none of this round's calls)."""
    start = init_adapter_dir(cfg.loop.init_adapter)
    if (k == 0 and start is None) or ep is None:
        return
    name = served_name(cfg, k)
    layout = RunLayout.of(cfg.runs_dir, cfg.name)
    adapter = start if k == 0 else layout.round(k - 1).train.adapter
    missing = list(not_serving(replica_urls(ep.url, cfg.proxy.upstreams), name, adapter, ep.api_key))
    if not missing:
        return
    if k == 0:
        log.info("round 0 samples from loop.init_adapter %s as %s", start, name)
        publish(cfg, start, name, resume=True)
        return
    storage.pull(adapter)  # a run in object storage resumed on another machine
    if not has_adapter(adapter):
        raise LoopError(f"round {k} samples from {name}, but {adapter} holds no adapter: remove "
                        f"{layout.round(k - 1).marker('train')} to train round {k - 1} again")
    log.info("%s do(es) not serve %s from %s (restarted?): loading it", ", ".join(missing), name, adapter)
    publish(cfg, adapter, name, resume=True)


def collect_stage(cfg: RunConfig, ep: Endpoint | None) -> dict:
    ensure_served(ep, cfg, cfg.round)
    summary = collect_round(cfg)
    if summary.text_only:
        log.warning("round %d: %d rollouts are text-only (the endpoint returned no token ids): GRPO refuses them",
                    cfg.round, len(summary.text_only))
    return {"policy": cfg.collect.policy, "rollouts": len(summary.rows), "mean_reward": summary.mean_reward,
            "prefix_cache_hit_rate": (summary.prefix_cache or {}).get("hit_rate")}


def measure_shift(cfg: RunConfig) -> None:
    """How far this round's training moved the policy on its own tokens (wharf/train/shift.py), unless
    rounds/<k>/train/shift.json is there: it lives in train's dir, so a round trained again is
    measured again."""
    layout = RunLayout.of(cfg.runs_dir, cfg.name)
    rnd = layout.round(cfg.round)
    if rnd.train.shift.is_file() or (read_marker(rnd, "train") or {}).get("carried"):
        return
    log.info("round %d: measuring the update on the round's own tokens", cfg.round)
    prev = layout.round(cfg.round - 1).train.adapter if cfg.round else init_adapter_dir(cfg.loop.init_adapter)
    for d in (convert_dir(cfg), rnd.train.adapter, prev):  # a run in object storage resumed on another machine
        if d is not None:
            storage.pull(d)
    write(rnd.train.shift, measure(convert_dir(cfg), base_model_dir(cfg), rnd.train.adapter, prev,
                                   cpu_kernel=cfg.train.cpu_kernel))
    storage.push_file(rnd.train.shift)


def health_inputs(rnd) -> tuple[str, ...]:
    """What the health checks read of a round (relative to its dir): pulled first, so that a run in
    object storage resumed on an empty mirror checks its finished rounds on their real files."""
    files = (rnd.collect.manifest, rnd.collect.rollouts, rnd.convert.stats, rnd.train.result, rnd.train.metrics,
             rnd.train.shift)
    return (*(f.relative_to(rnd.root).as_posix() for f in files),
            f"{rnd.collect.turns.relative_to(rnd.root).as_posix()}/part-*.parquet",
            f"{rnd.marker('collect').parent.relative_to(rnd.root).as_posix()}/*.json")


def check_health(cfg: RunConfig, ep: Endpoint | None = None) -> list:
    """Round cfg.round's health checks (wharf/pipeline/health.py), written to rounds/<k>/health.json.
    With an endpoint, `replicas_serve` asks every replica what it serves now."""
    layout = RunLayout.of(cfg.runs_dir, cfg.name)
    rnd = layout.round(cfg.round)
    for k in {0, cfg.round}:  # round 0: the reference of answers_ended and agents_in_time
        storage.pull(layout.round(k).root, health_inputs(layout.round(k)))
    allowed = allowed_policies(cfg.round, cfg.loop.max_staleness, cfg.start_policy, cfg.layout.tag)
    live = None
    if ep is not None and (read_marker(rnd, "publish") or {}).get("published"):
        live = not_serving(replica_urls(ep.url, cfg.proxy.upstreams), published_name(rnd),
                           rnd.train.adapter, ep.api_key)
    checks = check_round(rnd, cfg.collect.policy or cfg.endpoint.model, cfg.loop.health, allowed, live)
    for c in checks:
        log.log(logging.INFO if c.ok else logging.ERROR, "round %d health %s: %s: %s", c.round, c.name,
                "ok" if c.ok else "FAILED", c.seen)
    return checks


def publish_stage(cfg: RunConfig, ep: Endpoint | None) -> dict:
    name = cfg.policy(cfg.round + 1)
    adapter = RunLayout.of(cfg.runs_dir, cfg.name).round(cfg.round).train.adapter
    if ep is None:
        return {"policy": name, "published": False}
    # killed after the replicas took it but before the marker: each is checked, none reloaded
    storage.pull(adapter)  # a run in object storage resumed on another machine
    publish(cfg, adapter, name, resume=True)
    return {"policy": name, "adapter": str(adapter), "published": True}


def eval_due(every: int, k: int) -> bool:
    """Whether the loop evaluates after round k, i.e. the policy-v<k+1> it just published."""
    return every > 0 and (k + 1) % every == 0


def eval_stage(cfg: RunConfig, ep: Endpoint) -> dict:
    """policy-v<k+1> and the start policy (the base, or loop.init_adapter: what the run's training
    is measured against) on loop.eval_dataset, eval.attempts trials a task with the same seeds (the
    start's trials are run once, the first time, and reused: a finished job is kept)."""
    k = cfg.round + 1
    run = RunLayout.of(cfg.runs_dir, cfg.name).root
    start = cfg.loop.init_adapter or "base"
    ecfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, dataset=cfg.loop.eval_dataset, name=None,
                                                             policies=[start, f"{run}:{k}"]))
    summary = evaluate(ecfg, [resolve(s) for s in ecfg.eval.policies], ep)
    ref, new = (summary["policies"][label] for label in summary["last"])
    diff = summary["paired"][f"{new['label']} - {ref['label']}"]
    keep = ("mean", "low", "high", "tasks")
    return {"policy": policy_name(k), "sha256": new.get("sha256"), "k": k, "eval": eval_name(ecfg),
            "trials": new["trials"],
            **{key: new["reward"][key] for key in keep}, "start": start,
            "base": {key: ref["reward"][key] for key in keep},  # policy-v0's: the base, or the init adapter
            "diff": {key: diff[key] for key in keep}}


def train_checked(cfg: RunConfig) -> dict:
    """Round k's train, once its rows are known to be at most loop.max_staleness policies behind
    policy-v<k> (rows named by convert.jobs are the user's choice, and not checked)."""
    if not cfg.convert.jobs:
        index = round_index(cfg)
        policies = Counter(r.get("policy") for r in index.rollouts)
        check_lag(policies, cfg.round, cfg.loop.max_staleness, cfg.start_policy,
                  str(ConvertPaths(convert_dir(cfg)).index))
    return train_stage(cfg)


def learn_round(cfg: RunConfig, ep: Endpoint | None, waited_s: float | None = None) -> bool:
    """Round cfg.round's convert, train, update measure and publish (its collect is done);
    `waited_s`: how long the loop waited for that collect (overlapping rounds). True when this run
    published the round's policy (a resumed loop walking a finished round did not)."""
    rnd = RunLayout.of(cfg.runs_dir, cfg.name).round(cfg.round)
    waited = {} if waited_s is None else {"waited_for_collect_s": round(waited_s, 1)}
    run_stage(rnd, "convert", lambda: {**convert_stage(cfg), **waited})
    if run_stage(rnd, "train", lambda: train_checked(cfg)):
        forget_old_weights(rnd)
    measure_shift(cfg)
    release_memory()  # the models train and the measurement loaded, before the loop samples again
    return run_stage(rnd, "publish", lambda: publish_stage(cfg, ep))


def eval_round(cfg: RunConfig, ep: Endpoint | None) -> None:
    if ep is not None and eval_due(cfg.loop.eval_every, cfg.round):
        run_stage(cfg.round_layout, "eval", lambda: eval_stage(cfg, ep))


def close_round(cfg: RunConfig, t0: float, ep: Endpoint | None = None) -> None:
    """Round cfg.round's health checks, its line, the report; stops the loop when a check failed.
    `ep`: given when this run published the round, whose replicas are then asked what they serve;
    a finished round walked again keeps its publish record (a restart or a later publish may have
    unloaded its policy since; the round about to sample reloads its own: ensure_served)."""
    layout = RunLayout.of(cfg.runs_dir, cfg.name)
    checks = check_health(cfg, ep)
    storage.push_file(cfg.round_layout.health)
    print_round(layout, cfg.round)
    track_round(cfg)
    write_report(layout.root)  # before stopping: the report's table shows what failed
    enforce(checks)
    log.info("round %d done (%.0f s this run); %s serves next", cfg.round, time.monotonic() - t0,
             cfg.policy(cfg.round + 1))


def sync_rounds(cfg: RunConfig, ep: Endpoint | None) -> list[int]:
    """loop.max_staleness=0: collect round k from policy-v<k>, then convert, train, publish."""
    for k in range(cfg.rounds):
        t0 = time.monotonic()
        rcfg = round_config(cfg, k)
        run_stage(rcfg.round_layout, "collect", lambda: collect_stage(rcfg, ep))
        published = learn_round(rcfg, ep)
        eval_round(rcfg, ep)
        close_round(rcfg, t0, ep if published else None)
    return list(range(cfg.rounds))


def overlapped_rounds(cfg: RunConfig, ep: Endpoint | None) -> list[int]:
    """loop.max_staleness >= 1: round k+1 is collected (wharf/pipeline/overlap.py) while round k trains."""
    serve = lambda c, v: ensure_served(ep, c, v)  # noqa: E731
    with Collector(cfg, lambda j, policy: round_config(cfg, j, policy), serve) as collector:
        for k in range(cfg.rounds):
            t0 = time.monotonic()
            got, waited = collector.wait(k)
            rcfg = round_config(cfg, k, got.policy)
            published = learn_round(rcfg, ep, waited)
            collector.published.set(k + 1)  # the next collects may sample from it now
            eval_round(rcfg, ep)
            close_round(rcfg, t0, ep if published else None)
    return list(range(cfg.rounds))


def print_round(layout: RunLayout, k: int) -> None:
    try:
        print(f"loop: {round_line(gather_round(layout, k))}", flush=True)
    except Exception:  # a summary line never stops a loop
        log.exception("could not summarise round %d of %s", k, layout.root)


def run_loop(cfg: RunConfig) -> list[int]:
    """Run (or resume) rounds 0..cfg.rounds-1; returns the rounds that were completed."""
    trained = check_loop(cfg)  # cheapest first, the endpoint last: nothing written or started before
    layout = RunLayout.of(cfg.runs_dir, cfg.name)
    with lease.held(layout.root, "wharf loop"):  # one writer per run: a second driver is refused here
        return _run_held(cfg, layout, trained)


def _run_held(cfg: RunConfig, layout: RunLayout, trained) -> list[int]:
    layout.root.mkdir(parents=True, exist_ok=True)
    # A run in object storage resumed on another machine: where each round stands (each stage pulls its own inputs).
    storage.pull(layout.root, ("rounds/*/done/*.json", "rounds/*/health.json", "rounds/*/train/shift.json"))
    dump_config(cfg, layout.config)  # owner-only and never uploaded: it can hold API keys
    # One endpoint for the whole loop: started here when endpoint.launch is set and nothing answers.
    with launch(cfg, log_dir=layout.root / "logs") as ep:
        cfg = with_key(cfg, ep)  # its key (random when the loop started it) for every round's calls
        if cfg.loop.check_model and not cfg.proxy.text_only:  # a teacher is another model by design
            check_served(ep, cfg, trained)
        done = (overlapped_rounds if cfg.loop.max_staleness else sync_rounds)(cfg, ep)
        ensure_served(ep, cfg, cfg.rounds)  # left serving the latest policy (again, after a restart)
    return done


def main(argv: list[str] | None = None, prog: str = "wharf loop") -> int:
    cfg = cli_config(argv, prog, "collect -> convert -> train -> publish, `rounds` times; resumable.")
    return guarded(prog, lambda: _loop(cfg))


def _loop(cfg: RunConfig) -> int:
    done = run_loop(cfg)
    layout = RunLayout.of(cfg.runs_dir, cfg.name)
    print(f"loop: rounds {done[0]}..{done[-1]} done; {cfg.policy(done[-1] + 1)} in "
          f"{layout.round(done[-1]).train.adapter}; report: {layout.report}")
    return 0
