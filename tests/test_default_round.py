"""The main job, as `make collect` runs it on the embedded default: collect starts the local
engine and the proxy itself, runs 10 toy tasks x 4 attempts in bubblewrap with MinimalAgent, and
must leave groups GRPO can learn from. Minutes long; CI runs it."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from wharf import schema
from collect.audit import audit_round
from wharf.model_store import resolve_model_dir
from conftest import free_port

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the round itself may take up to its subprocess timeout below
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
def test_default_round_has_learning_signal(tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "collect", "--config", str(REPO / "configs/default.yaml"), f"runs_dir={tmp_path}",
           f"engine.port={port}", f"endpoint.url=http://127.0.0.1:{port}", f"proxy.port={free_port()}"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    collect_dir = tmp_path / "default/rounds/0/collect"
    manifest = json.loads((collect_dir / "manifest.json").read_text())
    rollouts = schema.read_table(collect_dir / "rollouts.parquet", "rollouts").to_pylist()
    assert len(rollouts) == 40 and manifest["counts"]["by_status"] == {"ok": 40}, manifest["counts"]
    # GRPO learns only from groups with both a success and a failure
    assert len(manifest["mixed_groups"]) >= 2, manifest["success_rate_by_task"]
    # A gross-regression guard: 12.6 min at 8 trials at once beside other work (25 min in CI at
    # 2 at once, where this guard, then at 24 min, caught it).
    assert manifest["wall_s"] < 20 * 60, manifest["wall_s"]
    tok = AutoTokenizer.from_pretrained(resolve_model_dir(None))
    report = audit_round(collect_dir, lambda ids: tok.decode(ids), tok.eos_token)
    assert report.checked == 40 and report.ok, report.problems
