"""A SIGKILL'd `python -m wharf.train` resumes to the same adapter; two CPU processes (gloo) match one."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from wharf.core.config import dump_config
from wharf.core.layout import RunLayout

sys.path.insert(0, str(Path(__file__).parent))
from train_util import convert_path, run_config, sample_rows, write_round  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ADV = [1.0, -1.0, 1.0, -1.0, 0.5, -0.5]
pytestmark = pytest.mark.slow


def setup_run(tmp: Path, name: str, *overrides: str) -> Path:
    cfg = run_config(tmp, f"name={name}", "train.lr=0.002", *overrides)
    write_round(convert_path(cfg), sample_rows(4, 10, 1.0, seed=0) + sample_rows(2, 10, 1.0, seed=1), ADV, 1.0)
    path = tmp / f"{name}.yaml"
    dump_config(cfg, path)
    return path


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(REPO)}


def adapter(tmp: Path, name: str) -> dict:
    paths = RunLayout.of(tmp, name).round(0).train
    return load_file(str(paths.adapter / "adapter_model.safetensors"))


def run_train(config: Path, *prefix: str) -> None:
    r = subprocess.run([*(prefix or [sys.executable]), "-m", "wharf.train", "--config", str(config)], cwd=REPO, env=env(),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]


def test_sigkill_then_resume_ends_with_the_same_adapter(tmp_path):
    # 3 files x 2 epochs = 6 steps, dropout on (the RNG state must come back too)
    over = ("train.rows_per_step=2", "train.epochs=2", "train.lora_dropout=0.1", "train.checkpoint_every=1")
    whole, killed = setup_run(tmp_path, "whole", *over), setup_run(tmp_path, "killed", *over)
    run_train(whole)
    metrics = RunLayout.of(tmp_path, "killed").round(0).train.metrics
    proc = subprocess.Popen([sys.executable, "-m", "wharf.train", "--config", str(killed)], cwd=REPO, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.is_file() and metrics.read_text().count("\n") >= 3:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not RunLayout.of(tmp_path, "killed").round(0).train.adapter.exists()
    run_train(killed)
    a, b = adapter(tmp_path, "whole"), adapter(tmp_path, "killed")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    steps = [__import__("json").loads(x)["step"] for x in metrics.read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_two_cpu_processes_match_one(tmp_path):
    # step 1: files 0+1 (one per process); step 2: file 2 alone (process 1 runs a zero-weight pass)
    over = ("train.rows_per_step=4",)
    one, two = setup_run(tmp_path, "one", *over), setup_run(tmp_path, "two", *over)
    run_train(one)
    run_train(two, sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--cpu",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "9510")
    a, b = adapter(tmp_path, "one"), adapter(tmp_path, "two")
    init = {k: torch.zeros_like(v) if "lora_B" in k else None for k, v in a.items()}
    for k in a:
        diff = (a[k] - b[k]).abs().max().item()
        assert diff <= 1e-5, (k, diff)  # stated tolerance: 1e-5 absolute on every LoRA weight
        if init[k] is not None:
            assert a[k].abs().max() > 1e-4  # the B matrices did move (zero at the start)
