"""The stages as the loop and replay run them: each under a marker (RoundLayout.marker: its wall
time and what it made), so a run killed anywhere resumes at the stage it was in. This module
drives convert and train only (replay needs no agent: it must not load collect or harbor);
wharf/pipeline/loop.py adds collect and publish."""
from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from wharf.core import atomic
from wharf.core.batches import BatchIndex, read_index
from wharf.convert.stage import convert_round
from wharf.pipeline.report import write_report as _write_report
from wharf.pipeline.report.data import gather_round
from wharf.pipeline.report.metrics import round_metrics
from wharf.train.stage import convert_dir, push_outputs, train_round
from wharf.core import storage, tracking
from wharf.core.config import RunConfig
from wharf.core.errors import WharfError
from wharf.core.layout import ConvertPaths, RoundLayout, RunLayout, init_adapter_dir

log = logging.getLogger("wharf.loop")


class LoopError(WharfError, RuntimeError):
    """The loop cannot go on; the message says what to do."""


def read_marker(rnd: RoundLayout, stage: str) -> dict | None:
    try:
        return json.loads(rnd.marker(stage).read_text())
    except (FileNotFoundError, ValueError):
        return None  # a marker cut short by a kill is no marker: the stage runs again


def write_marker(rnd: RoundLayout, stage: str, wall_s: float, **info) -> None:
    info.pop("wall_s", None)  # the marker's wall_s is the stage's as the loop timed it
    path = rnd.marker(stage)
    atomic.write_json(path, {"stage": stage, "round": rnd.k, "wall_s": round(wall_s, 1),
                             "ended_at": dt.datetime.now(dt.timezone.utc).isoformat(), **info})
    storage.push_file(path)  # a run in object storage: the marker after what the stage pushed


def drop_marker(rnd: RoundLayout, stage: str) -> None:
    """The stage runs again on the next pass (here and, in object storage, in the bucket)."""
    path = rnd.marker(stage)
    if read_marker(rnd, stage) is None:
        return
    path.unlink(missing_ok=True)
    if (url := storage.url_of(path)) is not None:
        storage.delete(url)


def forget_old_weights(rnd: RoundLayout) -> None:
    """A round trained again has new weights in the same dir: it is published (and checked) again,
    and its held-out figures, which are the old weights', are measured again (the eval's trials of
    the old weights stay, under their own label: wharf/pipeline/eval.py)."""
    for stage in ("publish", "eval"):
        drop_marker(rnd, stage)


def run_stage(rnd: RoundLayout, stage: str, fn: Callable[[], dict | None]) -> bool:
    """Run `fn` unless the stage's marker says it is done; True when it ran."""
    if read_marker(rnd, stage) is not None:
        log.info("round %d: %s already done", rnd.k, stage)
        return False
    log.info("round %d: %s", rnd.k, stage)
    t0 = time.monotonic()
    info = fn() or {}
    write_marker(rnd, stage, time.monotonic() - t0, **info)
    return True


def convert_stage(cfg: RunConfig) -> dict:
    stats = convert_round(cfg)
    return {"rows": (stats.get("rows") or {}).get("count"), "convert_wall_s": stats.get("wall_s")}


def round_index(cfg: RunConfig) -> BatchIndex:
    """Round cfg.round's index.json; in a run in object storage the bucket's (a loop resumed on an
    empty mirror, its round converted but not trained)."""
    storage.pull_file(ConvertPaths(convert_dir(cfg)).index)
    return read_index(convert_dir(cfg))


def has_signal(cfg: RunConfig) -> bool:
    """Whether convert kept any loss token (False: every group's rewards were all equal)."""
    return round_index(cfg).loss_tokens > 0


def carry_policy(cfg: RunConfig) -> dict:
    """A round with nothing to learn from: policy-v<k+1> is policy-v<k>'s adapter under the new
    name (every round publishes a new name; the next round's train continues from it)."""
    layout = RunLayout.of(cfg.runs_dir, cfg.name)
    start = init_adapter_dir(cfg.loop.init_adapter)
    if cfg.round == 0 and start is None:
        raise LoopError(f"round 0 of {layout.root} has no group with different rewards: nothing to learn from "
                        "(more collect.attempts, or tasks the base model solves sometimes)")
    src = layout.round(cfg.round - 1).train.adapter if cfg.round else start
    dst = layout.round(cfg.round).train.adapter
    if cfg.round:
        storage.pull(src)  # in object storage, a machine with an empty mirror gets it from the bucket
    tmp = dst.with_name(".adapter.carry")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(tmp, dst)
    push_outputs(layout.round(cfg.round).train)
    log.warning("round %d: no group with signal; %s carries %s unchanged", cfg.round,
                cfg.policy(cfg.round + 1), cfg.policy(cfg.round))
    return {"policy": cfg.policy(cfg.round + 1), "adapter": str(dst), "steps": 0, "carried": cfg.policy(cfg.round)}


def train_stage(cfg: RunConfig) -> dict:
    if not has_signal(cfg):
        return carry_policy(cfg)
    r = train_round(cfg, convert=convert_round)
    return {"policy": r.policy, "adapter": r.adapter, "steps": r.steps, "mismatch_mean": r.mismatch_mean,
            "train_wall_s": r.wall_s}


def write_report(run_dir: Path) -> None:
    try:
        log.info("report: %s", _write_report(run_dir))
    except Exception:  # the report never stops a loop
        log.exception("could not write the report of %s", run_dir)


def track_round(cfg: RunConfig) -> None:
    """Round cfg.round's figures to train.log_with's trackers (`round/*`), once: its `tracked`
    marker keeps a resumed loop from logging a finished round again."""
    rnd = cfg.round_layout
    if not cfg.train.log_with or read_marker(rnd, "tracked") is not None:
        return
    t0 = time.monotonic()
    metrics = round_metrics(gather_round(cfg.layout, cfg.round))
    with tracking.open_trackers(tracking.TrackerRun.of(cfg)) as trackers:
        trackers.log("round", metrics, cfg.round)
    write_marker(rnd, "tracked", time.monotonic() - t0, metrics=len(metrics))
