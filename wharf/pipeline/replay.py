"""Replay: convert + train from stored collect dirs only (any mix of runs and rounds) into a new
run dir, with no agent and no endpoint. `make replay JOBS="DIR ..."`, i.e.

    wharf replay --config FILE --job DIR [--job DIR ...] [key=value ...]

The new run (`name`, default replay-<UTC time>) gets round 0's convert/ and train/ (a new adapter
from the base model), rounds/0/train/offpolicy.json (how far off-policy each job is for the
base model: ratio and mismatch per job) and report.html. Run again with the same name, it
resumes at the stage where it stopped (the loop's stage markers).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import shutil
from pathlib import Path

from wharf.train import offpolicy
from wharf.core import configio
from wharf.core.config import COMMAND_KEYS, RunConfig, dump_config, load_config
from wharf.core.entry import guarded
from wharf.core.errors import WharfError
from wharf.core import schema, storage
from wharf.core.layout import JOB_FILES, CollectPaths, RunLayout
from wharf.core.model_identity import trained_model
from wharf.core.model_store import pick_device

from .stages import LoopError, convert_stage, run_stage, track_round, train_stage, write_report

log = logging.getLogger("wharf.replay")


def check_jobs(jobs: list[str]) -> list[str]:
    """Every job dir must be a finished collect dir; the same dir twice would count twice."""
    if not jobs:
        raise LoopError("no jobs: name the collect dirs, wharf replay --job runs/<run>/rounds/<k>/collect ...")
    out = []
    for j in jobs:
        p = CollectPaths(storage.local_path(j))
        storage.pull(p.root, JOB_FILES)  # a job in object storage (s3://...): into its local mirror
        if not p.rollouts.is_file():
            raise LoopError(f"{j} is not a collect dir (no rollouts.parquet): name "
                            "runs/<run>/rounds/<k>/collect dirs")
        schema.read_table(p.rollouts, "rollouts", ["rollout_id"])  # readable, of a version we know
        resolved = j.rstrip("/") if storage.is_remote(j) else str(p.root.resolve())
        if resolved in out:
            raise LoopError(f"{j} is named twice; its rollouts would count twice")
        out.append(resolved)
    return out


def replay_config(cfg: RunConfig, jobs: list[str]) -> RunConfig:
    train = dataclasses.replace(cfg.train, publish=False)
    return dataclasses.replace(cfg, round=0, convert=dataclasses.replace(cfg.convert, jobs=jobs), train=train)


def offpolicy_stage(cfg: RunConfig) -> dict:
    rnd = RunLayout.of(cfg.runs_dir, cfg.name).round(cfg.round)
    model_dir = trained_model(cfg).path
    jobs = offpolicy.write(rnd.convert.root, rnd.train.offpolicy, model_dir,
                           pick_device(cfg.train.device))
    for j in jobs:
        log.info("job %s (%s): %d tokens, mismatch mean %.4f, ratio mean %.3f", j["name"], j["policies"],
                 j["tokens"], j.get("mismatch_mean", float("nan")), j.get("ratio_mean", float("nan")))
    return {"jobs": len(jobs)}


def run_replay(cfg: RunConfig) -> Path:
    layout = RunLayout.of(cfg.runs_dir, cfg.name)
    storage.pull(layout.root, ("rounds/*/done/*.json",))  # a replay resumed on another machine
    prev = layout.config
    if prev.is_file():
        old = load_config(prev)
        if sorted(old.convert.jobs) != sorted(cfg.convert.jobs):
            raise LoopError(f"{layout.root} is a replay of other jobs ({old.convert.jobs}); "
                            "choose another name=")
    fresh = not layout.root.exists()
    layout.root.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, layout.config)  # owner-only and never uploaded: it can hold API keys
    rnd = layout.round(0)
    try:
        run_stage(rnd, "convert", lambda: convert_stage(cfg))
    except WharfError:
        if fresh:  # refused at its convert (rows it cannot use): no half-made run dir left behind
            shutil.rmtree(layout.root, ignore_errors=True)
        raise
    (rnd.train.root).mkdir(parents=True, exist_ok=True)
    run_stage(rnd, "offpolicy", lambda: offpolicy_stage(cfg))
    run_stage(rnd, "train", lambda: train_stage(cfg))
    track_round(cfg)
    write_report(layout.root)
    return layout.root


def main(argv: list[str] | None = None, prog: str = "wharf replay") -> int:
    p = configio.parser(prog, RunConfig, "convert + train from stored collect dirs into a new run dir; no agent, "
                                         "no endpoint.", COMMAND_KEYS["replay"])
    p.add_argument("--job", action="append", default=[], help="a stored collect dir (repeat for more)")
    args = p.parse_args(argv)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    cfg = configio.from_args(args, prog, RunConfig, extra=[f"name=replay-{stamp}"])
    return guarded(prog, lambda: _replay(cfg, args.job))


def _replay(cfg: RunConfig, jobs: list[str]) -> int:
    root = run_replay(replay_config(cfg, check_jobs(jobs)))
    run = RunLayout(root)
    print(f"replay: adapter in {storage.describe(run.round(0).train.adapter)}; report: {storage.describe(run.report)}")
    return 0
