"""Build the accelerate setup for a round and run its steps: resume, metrics, checkpoints."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from wharf.core import atomic, cpu_linear, model_store, tracking
from wharf.core.config import RunConfig
from wharf.core.layout import RunLayout, TrainPaths, init_adapter_dir

from . import checkpoint
from .errors import TrainError
from .loss import LossConfig
from .model import REFERENCE, PolicyLogprobs, load_policy, load_reference, lora_state, set_lora_state
from .trainer import Trainer

@dataclass
class Setup:
    acc: object
    peft: torch.nn.Module
    trainer: Trainer
    checkpoint_every: int
    trackers: tracking.TrackerRun | None = None  # train.log_with's (None: none)
    step_offset: int = 0  # optimizer steps of earlier rounds: tracker curves run on across rounds
    sched_offset: int = 0  # optimizer steps the resumed AdamW state has taken (the warmup goes on from there)


def _accelerator(cfg: RunConfig):
    from accelerate import Accelerator

    t = cfg.train
    if t.device == "cuda" and not torch.cuda.is_available():
        raise TrainError("train.device=cuda but torch sees no CUDA device; use train.device=cpu or auto")
    return Accelerator(cpu=t.device == "cpu", mixed_precision=t.mixed_precision)


def build(cfg: RunConfig, start_adapter: Path | None, batches, loss_cfg: LossConfig) -> Setup:
    from accelerate.utils import set_seed

    run = RunLayout.of(cfg.runs_dir, cfg.name)
    acc = _accelerator(cfg)
    set_seed(cfg.train.seed)
    peft_model, _ = load_policy(cfg, start_adapter, device="cpu")
    if cfg.train.cpu_kernel and acc.device.type == "cpu":
        cpu_linear.install(peft_model, model_store.cache_dir() / "kernels", who="train")
    ref = init_adapter_dir(cfg.loop.init_adapter) if cfg.train.kl_coef > 0 and cfg.train.kl_ref == "start" else None
    if ref is not None:  # loaded before the optimizer takes the trainable parameters
        load_reference(cfg, peft_model, ref)
    policy = PolicyLogprobs(peft_model, cfg.train.logprob_chunk)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    done = _resume_optimizer(cfg, start_adapter, opt)
    warmup = max(1, cfg.train.warmup)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (done + s + 1) / warmup))
    # The scheduler stays unprepared: accelerate would step it once per process.
    policy, opt = acc.prepare(policy, opt)
    trainer = Trainer(acc, policy, peft_model, opt, sched, batches, loss_cfg, cfg.train.max_grad_norm,
                      kl=cfg.train.kl_coef > 0, reference=REFERENCE if ref is not None else None)
    return Setup(acc, peft_model, trainer, cfg.train.checkpoint_every,
                 trackers=tracking.TrackerRun.of(cfg) if cfg.train.log_with else None,
                 step_offset=_earlier_steps(run, cfg.round), sched_offset=done)


def _resume_optimizer(cfg: RunConfig, start_adapter: Path | None, opt) -> int:
    """Load the previous round's AdamW moments into `opt` (its lr and other settings stay this
    config's); returns the optimizer steps they hold (0: a fresh optimizer)."""
    if start_adapter is None or not cfg.train.resume_optimizer or cfg.round == 0:
        return 0  # round 0 of a warm start: the adapter continues, its optimizer (another objective's) does not
    path = TrainPaths(start_adapter.parent).optimizer  # beside the adapter it continues from
    if not path.is_file():
        raise TrainError(f"{path}: missing, so round {cfg.round} would restart AdamW from zero; train "
                         f"round {cfg.round - 1} again, or set train.resume_optimizer=false")
    saved = torch.load(path, map_location="cpu", weights_only=True)
    new = opt.state_dict()
    params = [p for g in opt.param_groups for p in g["params"]]
    state = saved["optimizer"]["state"]
    if sorted(state) != list(range(len(params))) or any(
            state[i]["exp_avg"].shape != p.shape for i, p in enumerate(params)):
        raise TrainError(f"{path}: the optimizer state does not fit this adapter's parameters; "
                         "set train.resume_optimizer=false to start AdamW afresh")
    opt.load_state_dict({**new, "state": state})
    return int(saved["steps"])


def save_optimizer(setup: Setup, path: Path, steps: int) -> None:
    """AdamW's state after this round, for the next one (written atomically)."""
    state = {"optimizer": setup.trainer.opt.state_dict(), "steps": setup.sched_offset + steps}
    atomic.write_with(path, lambda tmp: torch.save(state, tmp))


def _earlier_steps(run: RunLayout, k: int) -> int:
    """Optimizer steps recorded by rounds before k (a line of metrics.jsonl per step)."""
    total = 0
    for j in range(k):
        metrics = run.round(j).train.metrics
        if metrics.is_file():
            total += sum(1 for line in metrics.read_bytes().splitlines() if line.strip())
    return total


def _resume(setup: Setup, paths, fingerprint: dict) -> dict:
    state = checkpoint.load(paths.checkpoint)
    if state is None:
        return {"step": 0, "skipped": 0, "metrics_bytes": 0, "run_s": 0.0}
    meta = state["meta"]
    if meta.get("fingerprint") != fingerprint:
        raise TrainError(f"{paths.checkpoint}: written by another train config or other micro-batches; "
                           f"delete {paths.root} to start this round's training over")
    set_lora_state(setup.peft, state["lora"])
    setup.trainer.opt.load_state_dict(state["optimizer"])
    setup.trainer.sched.load_state_dict(state["scheduler"])
    return meta


def _prox(setup: Setup, steps, start: int, paths) -> None:
    """Recompute (step 0) or reload (resume) the sampling policy's log-probs of this process's files."""
    tr, acc = setup.trainer, setup.acc
    if not tr.keeps_prox:
        return
    if start > 0:
        tr.prox = {k: v.to(acc.device) for k, v in load_prox(_prox_path(setup, paths)).items()}
        return
    mine = lambda s: s.for_rank(acc.process_index, acc.num_processes)  # noqa: E731
    files = {i for s in steps for i in mine(s)}
    if not tr.stochastic and steps:
        files -= set(mine(steps[0]))  # step 0 runs at the sampling policy: its own log-probs are prox
    tr.compute_prox(sorted(files))


def load_prox(path: Path) -> dict[int, torch.Tensor]:
    from safetensors.torch import load_file

    return {int(k): v for k, v in load_file(str(path)).items()} if path.is_file() else {}


def _prox_path(setup: Setup, paths) -> Path:
    return paths.prox(setup.acc.process_index)


def _save_prox(setup: Setup, paths) -> None:
    from safetensors.torch import save_file

    if setup.trainer.prox:
        tensors = {str(k): v.cpu().contiguous() for k, v in setup.trainer.prox.items()}
        atomic.write_with(_prox_path(setup, paths), lambda tmp: save_file(tensors, str(tmp)))


def run_steps(setup: Setup, steps, paths, fingerprint: dict, progress: bool) -> dict:
    from tqdm import tqdm

    acc, tr = setup.acc, setup.trainer
    paths.root.mkdir(parents=True, exist_ok=True)
    meta = _resume(setup, paths, fingerprint)
    start, skipped, run_s = meta["step"], meta["skipped"], meta.get("run_s", 0.0)
    _prox(setup, steps, start, paths)
    metrics_f = None
    trackers = tracking.Trackers([])
    if acc.is_main_process:
        if setup.trackers is not None:
            trackers = tracking.open_trackers(setup.trackers)
        metrics_f = open(paths.metrics, "a+b")
        metrics_f.truncate(meta["metrics_bytes"])  # lines of steps after the checkpoint are redone
    bar = tqdm(total=len(steps), initial=start, desc="train", unit="step", disable=not (progress and acc.is_main_process))
    first_mm: dict = {k: meta[k] for k in ("mismatch_mean", "mismatch_max") if k in meta}
    t_run = time.monotonic()
    for n in range(start, len(steps)):
        m = tr.step(steps[n], first=n == 0)
        skipped += m["skipped"]
        if n == 0 and "mismatch_mean" in m:
            first_mm = {"mismatch_mean": m["mismatch_mean"], "mismatch_max": m["mismatch_max"]}
        m = {"step": n + 1, "epoch": steps[n].epoch, **m}
        if metrics_f is not None:
            metrics_f.write((json.dumps(m) + "\n").encode())
            metrics_f.flush()
        trackers.log("train", {k: v for k, v in m.items() if k != "step"}, setup.step_offset + n + 1)
        bar.update(1)
        bar.set_postfix(loss=f"{m['loss']:.4f}", clip=f"{m['clip_low'] + m['clip_high']:.3f}", gnorm=f"{m['grad_norm']:.3f}")
        every = setup.checkpoint_every
        if every and (n + 1) % every == 0 and n + 1 < len(steps):
            _checkpoint(setup, paths, n + 1, skipped, fingerprint, metrics_f,
                        run_s + time.monotonic() - t_run, first_mm)
    bar.close()
    trackers.close()
    if metrics_f is not None:
        metrics_f.close()
    return {"skipped": skipped, "wall_s": run_s + time.monotonic() - t_run, **first_mm}


def _checkpoint(setup: Setup, paths, step: int, skipped: int, fingerprint: dict, metrics_f, run_s: float,
                first_mm: dict) -> None:
    acc = setup.acc
    _save_prox(setup, paths)  # every process its own, before `latest` names the checkpoint
    acc.wait_for_everyone()
    if acc.is_main_process:
        meta = {"skipped": skipped, "metrics_bytes": metrics_f.tell(), "fingerprint": fingerprint,
                "run_s": run_s, **first_mm}
        checkpoint.save(paths.checkpoint, step, lora_state(setup.peft), setup.trainer.opt.state_dict(),
                        setup.trainer.sched.state_dict(), meta)
    acc.wait_for_everyone()
