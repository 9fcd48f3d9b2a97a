"""`train_round(cfg)`: round k's micro-batches -> rounds/<k>/train/adapter (policy-v<k+1>).

Reads only convert's micro-batches (wharf.batches), writes metrics.jsonl per optimizer step,
checkpoints atomically (a killed run resumes where it stopped and ends with the same adapter),
and publishes the adapter to the endpoint when one answers. A run in object storage trains in its
local mirror: its inputs are pulled first and its outputs pushed at the end (wharf/core/storage.py).
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from wharf.core.batches import BatchFormatError, load_micro_batch, read_index
from wharf.core.config import RunConfig, to_dict
from wharf.core import lease, storage, tracking
from wharf.core.model_identity import trained_model
from wharf.core.layout import ConvertPaths, RunLayout, adapter_config, has_adapter, init_adapter_dir, policy_name

from . import shift
from .errors import TrainError
from .loss import LossConfig
from .model import save_adapter
from .plan import plan_steps
from .publish import try_publish
from .records import TrainResult
from .run import build, run_steps, save_optimizer

log = logging.getLogger("wharf.train")


def convert_dir(cfg: RunConfig) -> Path:
    if cfg.convert.out_dir:
        return storage.local_path(cfg.convert.out_dir)
    return RunLayout.of(cfg.runs_dir, cfg.name).round(cfg.round).convert.root


def ensure_converted(cfg: RunConfig, progress: bool, convert: Callable | None) -> Path:
    """The round's micro-batches; made first by `convert(cfg, progress=...)` when missing (the
    orchestration passes convert's stage in: train imports no other stage)."""
    d = convert_dir(cfg)
    if ConvertPaths(d).index.is_file():
        return d
    if not _is_main():  # under accelerate launch only the first process converts
        deadline = time.monotonic() + 3600
        while not ConvertPaths(d).index.is_file():
            if time.monotonic() > deadline:
                raise TrainError(f"{d}: the first process did not finish convert within an hour")
            time.sleep(1)
        return d
    if convert is None:
        raise TrainError(f"{d}: no micro-batches (index.json): run convert on this round first "
                         "(`wharf convert`, or `wharf train`, which converts first)")
    log.info("no micro-batches in %s: running convert first", d)
    convert(cfg, progress=progress)
    return d


def init_adapter(cfg: RunConfig) -> Path | None:
    """Round 0: a new adapter, or loop.init_adapter's (a warm start). Round k: policy-v<k>, the
    adapter round k-1 trained."""
    if cfg.round == 0:
        start = init_adapter_dir(cfg.loop.init_adapter)
        if start is not None and not has_adapter(start):
            raise TrainError(f"loop.init_adapter={cfg.loop.init_adapter!r}: {start} holds no adapter "
                             "(no adapter_config.json)")
        return start
    prev = RunLayout.of(cfg.runs_dir, cfg.name).round(cfg.round - 1).train.adapter
    if not has_adapter(prev):
        raise TrainError(f"round {cfg.round} continues from {policy_name(cfg.round)}, but {prev} holds no adapter: "
                         f"train round {cfg.round - 1} first")
    return prev


def loss_config(cfg: RunConfig) -> LossConfig:
    t = cfg.train
    return LossConfig(eps_low=t.eps_low, eps_high=t.eps_high, agg=t.loss_agg, constant=loss_constant(cfg),
                      kl_coef=t.kl_coef, mismatch=t.mismatch, mismatch_cap=t.mismatch_cap,
                      mismatch_bound=t.mismatch_bound, objective=t.objective)


def loss_constant(cfg: RunConfig) -> float:
    """The Dr. GRPO constant, fixed for the run (never a function of one round's rows, so the step
    size does not drift): train.loss_constant, else the generation budget of a rollout (the config
    refuses loss_agg=constant at load time when it has neither)."""
    t = cfg.train
    if t.loss_constant > 0:
        return float(t.loss_constant)
    if t.loss_agg != "constant":
        return 1.0  # unused by the other aggregations
    return float(cfg.rollout_budget())


def load_batches(d: Path):
    """The index and every micro-batch, checked before anything is written."""
    index = read_index(d)
    if not index.files or index.loss_tokens == 0:
        raise TrainError(f"{d}: no rows with loss tokens (every group without signal?): nothing to train on")
    batches = []
    for f in index.files:
        mb = load_micro_batch(d / f.file)
        if tuple(mb.shape) != (f.rows, f.seq_len):
            raise BatchFormatError(f"{d / f.file}: shape {tuple(mb.shape)}, index.json says "
                                   f"({f.rows}, {f.seq_len}); re-run convert")
        batches.append(mb)
    return index, batches


def pull_inputs(cfg: RunConfig, paths) -> None:
    """A run in object storage: this round's train dir (a resume), its micro-batches, the adapter
    and optimizer state it continues from, into the local mirror (no-ops for a local run)."""
    storage.pull(paths.root)
    storage.pull(convert_dir(cfg))
    if cfg.round:
        prev = RunLayout.of(cfg.runs_dir, cfg.name).round(cfg.round - 1).train
        storage.pull(prev.root, (f"{prev.adapter.name}/*", prev.optimizer.name))


def push_outputs(paths) -> None:
    """Everything the round made; the adapter's config and result.json last (they mark it whole)."""
    last = (f"{paths.adapter.name}/{adapter_config(paths.adapter).name}", paths.result.name)
    storage.push(paths.root, last=last, delete_stale=True)


def train_round(cfg: RunConfig, progress: bool = True, convert: Callable | None = None) -> TrainResult:
    tracking.check(cfg.train.log_with)  # before anything is pulled, converted or loaded
    with lease.held(RunLayout.of(cfg.runs_dir, cfg.name).root, "wharf train"):  # one writer per run
        return _train_round(cfg, progress, convert)


def _train_round(cfg: RunConfig, progress: bool, convert: Callable | None) -> TrainResult:
    paths = RunLayout.of(cfg.runs_dir, cfg.name).round(cfg.round).train
    pull_inputs(cfg, paths)
    if paths.result.is_file() and has_adapter(paths.adapter):
        result = TrainResult.read(paths.result)
        log.info("round %d is already trained: %s", cfg.round, result.adapter)
    else:
        trained_model(cfg)  # one model per run: a train.model that is not the served one stops here, first
        d = ensure_converted(cfg, progress, convert)
        index, batches = load_batches(d)
        if index.mode == "sft" and cfg.train.objective != "sft":
            raise TrainError(f"{d}: supervised rows (convert.mode=sft: advantage 1, no behaviour log-probs), but "
                             f"train.objective={cfg.train.objective}: train them with train.objective=sft")
        result = _train(cfg, paths, index, batches, progress)
    if cfg.train.publish and not result.published and _is_main():
        result.published, result.publish_message = try_publish(cfg, paths.adapter, result.policy)
        result.write(paths.result)
    if _is_main():
        push_outputs(paths)
    return result


def _is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _train(cfg: RunConfig, paths, index, batches, progress: bool) -> TrainResult:
    steps = plan_steps(index, cfg.train.rows_per_step, cfg.train.tokens_per_step, cfg.train.epochs, cfg.train.seed)
    start = init_adapter(cfg)
    setup = build(cfg, start, batches, loss_config(cfg))
    fingerprint = {"train": to_dict(cfg.train), "files": [f.file for f in index.files], "steps": len(steps)}
    summary = run_steps(setup, steps, paths, fingerprint, progress)
    update = setup.trainer.shift_sums()  # every process: it reduces over them
    result = TrainResult(round=cfg.round, policy=cfg.policy(cfg.round + 1), adapter=storage.describe(paths.adapter),
                         steps=len(steps), skipped_steps=summary["skipped"], loss_tokens=index.loss_tokens,
                         mismatch_mean=summary.get("mismatch_mean"), mismatch_max=summary.get("mismatch_max"),
                         wall_s=round(summary["wall_s"], 1))
    if setup.acc.is_main_process:
        _save_final(setup, paths)
        if update is not None:  # before result.json: a round with a result has its shift (or the loop measures it)
            shift.write(paths.shift, {**shift.stats_of_sums(update),
                                      "weight_delta": shift.adapter_delta(paths.adapter, start)})
        save_optimizer(setup, paths.optimizer, len(steps))
        result.write(paths.result)
        shutil.rmtree(paths.checkpoint, ignore_errors=True)
        for prox in paths.prox_files():
            prox.unlink()
    setup.acc.wait_for_everyone()
    setup.acc.end_training()
    return result


def _save_final(setup, paths) -> None:
    tmp = paths.root / ".adapter.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_adapter(setup.peft, tmp)
    shutil.rmtree(paths.adapter, ignore_errors=True)
    os.replace(tmp, paths.adapter)
