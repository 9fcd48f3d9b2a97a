"""The RL loop: for k = 0..rounds-1, collect round k from policy-v<k> (round 0: the base model),
convert it, train it, publish policy-v<k+1>; the run report is rewritten after every round.

`python -m train.loop --config FILE [key=value ...]` (`make loop ROUNDS=N`: `rounds=N`).

Resumable: each finished stage leaves a marker (RoundLayout.marker: its wall time and what it
made); run again after a kill anywhere, the loop skips the marked stages and resumes the one it
was in (collect keeps its finished rollouts, convert is atomic, train restarts from its last
checkpoint). A larger `rounds` continues a finished loop. The endpoint is started once for the
whole loop when `endpoint.launch` is set and nothing answers (and stopped when the loop ends);
before each round samples, the loop makes sure the endpoint serves that round's policy, loading
the adapter again after an endpoint restart. After each round the loop's health checks
(train/health.py) run and stop the loop, naming what failed, when it is not learning.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from collect.config import RunConfig, dump_config
from collect.endpoint import Endpoint, launch, with_key
from collect.layout import RoundLayout, RunLayout, policy_name
from train.health import HealthError, enforce

log = logging.getLogger("wharf.loop")


class LoopError(RuntimeError):
    """The loop cannot go on; the message says what to do."""


def round_config(cfg: RunConfig, k: int) -> RunConfig:
    """Round k's config: sample from policy-v<k> (round 0: the base model); the loop publishes."""
    policy = cfg.endpoint.model if k == 0 else policy_name(k)
    train = cfg.train
    if hasattr(train, "publish"):
        train = dataclasses.replace(train, publish=False)
    return dataclasses.replace(cfg, round=k, collect=dataclasses.replace(cfg.collect, policy=policy), train=train)


def read_marker(rnd: RoundLayout, stage: str) -> dict | None:
    try:
        return json.loads(rnd.marker(stage).read_text())
    except (FileNotFoundError, ValueError):
        return None  # a marker cut short by a kill is no marker: the stage runs again


def write_marker(rnd: RoundLayout, stage: str, wall_s: float, **info) -> None:
    info.pop("wall_s", None)  # the marker's wall_s is the stage's as the loop timed it
    path = rnd.marker(stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"stage": stage, "round": rnd.k, "wall_s": round(wall_s, 1),
                               "ended_at": dt.datetime.now(dt.timezone.utc).isoformat(), **info}, indent=1))
    os.replace(tmp, path)


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


def ensure_served(ep: Endpoint | None, cfg: RunConfig, k: int) -> None:
    """Before round k samples: the endpoint must serve policy-v<k> (an endpoint that restarted has
    forgotten its adapters: load round k-1's again)."""
    if k == 0 or ep is None:
        return
    name = policy_name(k)
    if name in ep.models():
        return
    adapter = RunLayout.of(cfg.runs_dir, cfg.name).round(k - 1).train.adapter
    if not (adapter / "adapter_config.json").is_file():
        raise LoopError(f"round {k} samples from {name}, but {adapter} holds no adapter: remove "
                        f"{RunLayout.of(cfg.runs_dir, cfg.name).round(k - 1).marker('train')} to train round {k - 1} again")
    log.info("the endpoint does not serve %s: loading %s", name, adapter)
    _publish(cfg, adapter, name)


def _publish(cfg: RunConfig, adapter: Path, name: str) -> None:
    from train.publish import publish

    publish(cfg, adapter, name)


def collect_stage(cfg: RunConfig, ep: Endpoint | None) -> dict:
    from collect.runner import run as collect_round

    ensure_served(ep, cfg, cfg.round)
    summary = collect_round(cfg)
    return {"policy": cfg.collect.policy, "rollouts": len(summary.rows), "mean_reward": summary.mean_reward}


def convert_stage(cfg: RunConfig) -> dict:
    from convert.stage import convert_round

    stats = convert_round(cfg)
    return {"rows": (stats.get("rows") or {}).get("count"), "convert_wall_s": stats.get("wall_s")}


def has_signal(cfg: RunConfig) -> bool:
    """Whether convert kept any loss token (False: every group's rewards were all equal)."""
    from convert.records import read_index
    from train.stage import convert_dir

    return read_index(convert_dir(cfg)).loss_tokens > 0


def carry_policy(cfg: RunConfig) -> dict:
    """A round with nothing to learn from: policy-v<k+1> is policy-v<k>'s adapter under the new
    name (every round publishes a new name; the next round's train continues from it)."""
    layout = RunLayout.of(cfg.runs_dir, cfg.name)
    if cfg.round == 0:
        raise LoopError(f"round 0 of {layout.root} has no group with different rewards: nothing to learn from "
                        "(more collect.attempts, or tasks the base model solves sometimes)")
    src, dst = layout.round(cfg.round - 1).train.adapter, layout.round(cfg.round).train.adapter
    tmp = dst.with_name(".adapter.carry")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(tmp, dst)
    log.warning("round %d: no group with signal; %s carries %s unchanged", cfg.round,
                policy_name(cfg.round + 1), policy_name(cfg.round))
    return {"policy": policy_name(cfg.round + 1), "adapter": str(dst), "steps": 0, "carried": policy_name(cfg.round)}


def train_stage(cfg: RunConfig) -> dict:
    from train.stage import train_round

    if not has_signal(cfg):
        return carry_policy(cfg)
    result = train_round(cfg)
    out = dataclasses.asdict(result) if dataclasses.is_dataclass(result) else dict(vars(result))
    return {"policy": out.get("policy"), "adapter": out.get("adapter"), "steps": out.get("steps"),
            "mismatch_mean": out.get("mismatch_mean"), "train_wall_s": out.get("wall_s")}


def measure_shift(cfg: RunConfig) -> None:
    """How far this round's training moved the policy on its own tokens (train/shift.py), unless
    rounds/<k>/train/shift.json is there: it lives in train's dir, so a round trained again is
    measured again."""
    from train.model import base_model_dir
    from train.shift import measure, write
    from train.stage import convert_dir

    layout = RunLayout.of(cfg.runs_dir, cfg.name)
    rnd = layout.round(cfg.round)
    if rnd.train.shift.is_file() or (read_marker(rnd, "train") or {}).get("carried"):
        return
    log.info("round %d: measuring the update on the round's own tokens", cfg.round)
    prev = layout.round(cfg.round - 1).train.adapter if cfg.round else None
    write(rnd.train.shift, measure(convert_dir(cfg), base_model_dir(cfg), rnd.train.adapter, prev))


def check_health(cfg: RunConfig) -> list:
    """Round cfg.round's health checks (train/health.py), written to rounds/<k>/health.json."""
    from train.health import check_round

    rnd = RunLayout.of(cfg.runs_dir, cfg.name).round(cfg.round)
    checks = check_round(rnd, cfg.collect.policy or cfg.endpoint.model, cfg.loop.health)
    for c in checks:
        log.log(logging.INFO if c.ok else logging.ERROR, "round %d health %s: %s: %s", c.round, c.name,
                "ok" if c.ok else "FAILED", c.seen)
    return checks


def publish_stage(cfg: RunConfig, ep: Endpoint | None) -> dict:
    name = policy_name(cfg.round + 1)
    adapter = RunLayout.of(cfg.runs_dir, cfg.name).round(cfg.round).train.adapter
    if ep is None:
        return {"policy": name, "published": False}
    if name not in ep.models():  # killed after the endpoint took it but before the marker: done already
        _publish(cfg, adapter, name)
    return {"policy": name, "adapter": str(adapter), "published": True}


def run_round(cfg: RunConfig, ep: Endpoint | None) -> None:
    rnd = RunLayout.of(cfg.runs_dir, cfg.name).round(cfg.round)
    run_stage(rnd, "collect", lambda: collect_stage(cfg, ep))
    run_stage(rnd, "convert", lambda: convert_stage(cfg))
    run_stage(rnd, "train", lambda: train_stage(cfg))
    measure_shift(cfg)
    run_stage(rnd, "publish", lambda: publish_stage(cfg, ep))


def print_round(layout: RunLayout, k: int) -> None:
    from train.report.data import gather_round, round_line

    try:
        print(f"loop: {round_line(gather_round(layout, k))}", flush=True)
    except Exception:  # a summary line never stops a loop
        log.exception("could not summarise round %d of %s", k, layout.root)


def write_report(run_dir: Path) -> None:
    from train.report import write_report as write

    try:
        log.info("report: %s", write(run_dir))
    except Exception:  # the report never stops a loop
        log.exception("could not write the report of %s", run_dir)


def run_loop(cfg: RunConfig) -> list[int]:
    """Run (or resume) rounds 0..cfg.rounds-1; returns the rounds that were completed."""
    if cfg.rounds < 1:
        raise LoopError(f"rounds={cfg.rounds}: the loop needs at least one round (make loop ROUNDS=N)")
    layout = RunLayout.of(cfg.runs_dir, cfg.name)
    layout.root.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, layout.config)
    done = []
    # One endpoint for the whole loop: started here when endpoint.launch is set and nothing answers.
    with launch(cfg, log_dir=layout.root / "logs") as ep:
        cfg = with_key(cfg, ep)  # its key (random when the loop started it) for every round's calls
        for k in range(cfg.rounds):
            t0 = time.monotonic()
            rcfg = round_config(cfg, k)
            run_round(rcfg, ep)
            checks = check_health(rcfg)
            print_round(layout, k)
            write_report(layout.root)  # before stopping: the report's table shows what failed
            enforce(checks)
            log.info("round %d done (%.0f s this run); %s serves next", k, time.monotonic() - t0, policy_name(k + 1))
            done.append(k)
        ensure_served(ep, cfg, cfg.rounds)  # left serving the latest policy (again, after a restart)
    return done


def stage_errors() -> tuple[type, ...]:
    """The stages' own 'bad input / cannot go on' errors: printed as one line, not a traceback."""
    from collect.endpoint import EndpointError
    from collect.proxy_client import ServiceError
    from collect.tasksets import TaskSetError
    from collect.trials import TrialSetupError

    errs: list[type] = [LoopError, HealthError, EndpointError, ServiceError, TaskSetError, TrialSetupError]
    for mod, name in (("convert.reader", "ConvertInputError"), ("convert.records", "BatchFormatError"),
                      ("train.stage", "TrainError"), ("train.publish", "PublishError")):
        with contextlib.suppress(ImportError, AttributeError):
            errs.append(getattr(__import__(mod, fromlist=[name]), name))
    return tuple(errs)


def main(argv: list[str] | None = None) -> int:
    import sys

    from collect import envdefaults

    envdefaults.apply()  # before torch loads (this module imports it lazily)
    from collect.__main__ import setup_logging
    from collect.config import cli_config

    cfg = cli_config(argv, "python -m train.loop")
    setup_logging()
    try:
        done = run_loop(cfg)
    except stage_errors() as e:
        print(f"loop: {e}", file=sys.stderr)
        return 1
    layout = RunLayout.of(cfg.runs_dir, cfg.name)
    print(f"loop: rounds {done[0]}..{done[-1]} done; {policy_name(done[-1] + 1)} in "
          f"{layout.round(done[-1]).train.adapter}; report: {layout.report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
