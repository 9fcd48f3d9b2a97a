"""Trials `wharf eval` reads instead of running: a finished job of the same trials, sampled from
the same weights (the served name its manifest records carries their sha256 prefix), in this
eval or in the evaluated run's own evals (its loop's)."""
from __future__ import annotations

import json
from pathlib import Path

from wharf.core import storage
from wharf.core.config import RunConfig
from wharf.core.layout import EvalLayout, RunLayout

from .eval_policy import Policy, dataset_of, eval_name, served_digest


def _same_trials(cfg: RunConfig, manifest: dict) -> bool:
    """Whether a finished job ran the trials this eval would: the same tasks, agent, sandbox,
    sampling and seed, and at least as many attempts."""
    s, seed = manifest.get("sampling") or {}, 0 if cfg.sampling.seed is None else cfg.sampling.seed
    try:
        same_set = Path(manifest.get("dataset", "")).resolve() == Path(dataset_of(cfg)).resolve()
    except OSError:
        return False
    return (same_set and manifest.get("state") == "done" and (manifest.get("attempts") or 0) >= cfg.eval.attempts
            and (manifest.get("agent"), manifest.get("environment")) == (cfg.collect.agent, cfg.collect.environment)
            and (s.get("temperature"), s.get("top_p"), s.get("seed")) == (cfg.sampling.temperature, cfg.sampling.top_p, seed))


def stored_trials(cfg: RunConfig, p: Policy) -> RunLayout | None:
    """A run round's policy whose trials were already run with these very weights: this eval's own
    finished job (as the bucket has it: a re-run on another machine loads no adapter for it), or one
    the run's own loop ran with the same trials (runs/<run>/evals/*/<label>). None when this eval has
    an unfinished job of its own for the policy (it resumes that one), or no such job is found.
    A job's weights are the ones its manifest's served name carries (served_digest): a job under a
    label from before labels carried the weights is read only when they match."""
    if p.round is None or p.adapter is None:
        return None
    ev = cfg.layout.eval(eval_name(cfg))
    own = ev.policy(p.label)
    storage.pull(own.round(0).collect.root, ("manifest.json", "rollouts.parquet"))
    if own.round(0).collect.manifest.is_file():
        return own if _finished(own, cfg, p) else None
    evals = RunLayout(storage.local_path(p.spec.rpartition(":")[0])).evals
    for label in (p.label, legacy_label(p)):
        job = f"*/{label}/rounds/0/collect"
        storage.pull(ev.root, (f"{label}/rounds/0/collect/manifest.json", f"{label}/rounds/0/collect/rollouts.parquet"))
        storage.pull(evals, (f"{job}/manifest.json", f"{job}/rollouts.parquet"))  # what is read of them: the bucket's
        found = [ev.policy(label).root] + (sorted(evals.glob(f"*/{label}")) if evals.is_dir() else [])
        for d in found:
            if _finished(RunLayout(d), cfg, p):
                return RunLayout(d)
    return None


def legacy_label(p: Policy) -> str:
    """A run round's label before labels carried its weights (`<run>-policy-v<k>`)."""
    return p.label.rpartition("-")[0] if p.round else p.label


def stored_note(ev: EvalLayout, p: Policy, run: RunLayout) -> str:
    """The log line of a policy whose trials are read, not run: this eval's own finished job, or
    the one its run's loop ran (stored_trials)."""
    if run.root.parent == ev.root:
        return f"eval {ev.root.name}: {p.spec}: its trials are already in this eval, {run.root}: not run again"
    return f"eval {ev.root.name}: {p.spec}: reading the trials its run's loop already ran, {run.root}"


def _finished(run: RunLayout, cfg: RunConfig, p: Policy) -> bool:
    """Whether a policy's collect job there is done, with the trials this eval would run, sampled
    from p's weights."""
    try:
        manifest = json.loads(run.round(0).collect.manifest.read_text())
    except (OSError, ValueError):
        return False
    return served_digest(manifest.get("policy")) == p.digest and _same_trials(cfg, manifest)
