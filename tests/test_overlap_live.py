"""Overlapping rounds, live: a 2-round loop with loop.max_staleness=1 on a tiny subset of
datasets/learn (real engine, real harbor trials in bubblewrap, real convert, LoRA training and
publishing) is killed (SIGKILL, the loop's process group) while both halves run: round 1's
collect (a child process sampling from the base model) and round 0's train. Run again, it
resumes both: nothing is collected twice (round 1 keeps its job and its finished rollouts,
each (task, attempt) once, every call by the policy it started with), nothing is trained twice
(round 0's metrics hold each step once), and round 1 trains one policy behind, corrected."""
from __future__ import annotations

import json
import shutil
import signal
import sys
from pathlib import Path

import pytest

from wharf.core import procs, schema
from wharf.core.config import load_config
from wharf.core.layout import RunLayout
from conftest import REPO, free_port, kill_when
from wharf.pipeline.loop import run_loop
from wharf.pipeline.stages import read_marker

from test_loop import TASKS, _engine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800),
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")]

BASE = "smollm2-135m"


def _overrides(tmp_path: Path, port: int) -> list[str]:
    # 2 trials at a time: round 1's collect outlasts round 0's first optimizer steps (1 row each)
    return [f"runs_dir={tmp_path}", "name=run", "rounds=2", f"collect.tasks={TASKS}", "collect.attempts=4",
            "collect.concurrency=2", f"engine.port={port}", f"endpoint.url=http://127.0.0.1:{port}",
            f"proxy.port={free_port()}", "train.rows_per_step=1", "convert.max_tokens_per_batch=512",
            "endpoint.launch=false", "loop.max_staleness=1", "loop.health.min_trainable_tokens=0"]


def _both_halves_running(run: RunLayout) -> bool:
    metrics, manifest = run.round(0).train.metrics, run.round(1).collect.manifest
    if not (metrics.is_file() and metrics.read_text().count("\n") >= 1 and manifest.is_file()):
        return False
    try:
        return json.loads(manifest.read_text()).get("state") == "running"
    except ValueError:
        return False


def _kill_with_both_halves_running(cmd: list[str], run: RunLayout, log: Path, timeout: float = 900) -> dict:
    def ready() -> bool:
        assert read_marker(run.round(1), "collect") is None, \
            "round 1's collect ended before round 0 trained a step: nothing ran at once"
        return _both_halves_running(run)

    # tree: the collect child and its proxy die with the loop, as on a lost machine (left to
    # follow their parent, a proxy under load still held round 1's WAL when the resume began)
    kill_when(cmd, ready, log, "the two halves ran at once", timeout, tree=True)
    return json.loads(run.round(1).collect.manifest.read_text())


def test_overlapped_loop_killed_in_both_halves_resumes_each_once(tmp_path):
    port = free_port()
    # without the prefix cache: with it, round 1's 12 trials can end before round 0's first step
    engine = _engine(port, tmp_path / "engine.log", "engine.prefix_cache=false")
    try:
        args = _overrides(tmp_path, port)
        run = RunLayout(tmp_path / "run")
        cmd = [sys.executable, "-m", "wharf.pipeline.cli", "loop", "--config", str(REPO / "configs/learn.yaml"), *args]
        before = _kill_with_both_halves_running(cmd, run, tmp_path / "killed.log")
        assert before["policy"] == BASE and read_marker(run.round(0), "train") is None

        assert run_loop(load_config(REPO / "configs/learn.yaml", args)) == [0, 1]
    finally:
        procs.stop(engine)

    after = json.loads(run.round(1).collect.manifest.read_text())
    assert after["job_id"] == before["job_id"] and after["policy"] == BASE and after["state"] == "done"
    rows = schema.read_table(run.round(1).collect.rollouts, "rollouts").to_pylist()
    keys = [(r["task_id"], r["attempt"]) for r in rows]
    assert len(keys) == 12 and len(set(keys)) == 12  # each (task, attempt) once
    assert {t["policy"] for t in schema.read_dir(run.round(1).collect.turns, "turns").to_pylist()} == {BASE}
    assert read_marker(run.round(1), "collect")["lag"] == 1
    assert (run.round(1).collect.logs / "loop-collect.log").is_file()

    result = json.loads(run.round(0).train.result.read_text())
    steps = [json.loads(line)["step"] for line in run.round(0).train.metrics.read_text().splitlines()]
    assert steps == list(range(1, result["steps"] + 1))  # each step once, after the resume too
    for k in (0, 1):
        assert all(c["ok"] for c in json.loads(run.round(k).health.read_text())), k
    if read_marker(run.round(1), "train").get("steps"):  # round 1 had signal: trained one policy behind
        first = json.loads(run.round(1).train.metrics.read_text().splitlines()[0])
        assert first["is_weight_mean"] > 0 and first["mismatch_mean"] > 1e-3  # policy-v1 vs the base's samples
    assert "Overlapping rounds" in run.report.read_text()
