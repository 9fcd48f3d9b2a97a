"""Two real local engines as one fleet (issue #36): a 2-round loop whose second replica restarts
between rounds (its runtime LoRAs gone). Round 1 is served by policy-v1 on both, with the
trainer's log-probs (the loop's health checks, max_served_mismatch on), and no trial is lost."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from wharf import procs, schema
from wharf.config import load_config
from wharf.endpoint import Endpoint
from wharf.layout import RunLayout
from conftest import REPO, free_port
from pipeline.loop import run_loop

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")]


def _engine(port: int, log: Path):
    proc = procs.spawn([sys.executable, "-m", "engine", "--config", str(REPO / "configs/learn.yaml"),
                        f"engine.port={port}", "engine.threads=1"], log, cwd=REPO)
    Endpoint(f"http://127.0.0.1:{port}").wait_healthy(300, proc, log)
    return proc


def test_a_replica_restarted_between_rounds_serves_the_policy_again(engine_url, tmp_path):
    port = free_port()
    second = f"http://127.0.0.1:{port}"
    args = lambda rounds: [  # noqa: E731
        f"runs_dir={tmp_path}", "name=fleet", f"rounds={rounds}", "collect.tasks=[sed-sub,echo-number,sed-world]",
        "collect.attempts=4", "collect.concurrency=4", f"endpoint.url={engine_url}", "endpoint.launch=false",
        f"proxy.upstreams=[{second}]", f"proxy.port={free_port()}", "train.rows_per_step=2",
        "convert.max_tokens_per_batch=512", "loop.health.max_served_mismatch=0.1"]
    engine = _engine(port, tmp_path / "engine.log")
    try:
        run_loop(load_config(REPO / "configs/learn.yaml", args(1)))
        procs.stop(engine)
        engine = _engine(port, tmp_path / "engine2.log")  # the same replica, its LoRAs gone
        assert not any("policy-v1" in m for m in Endpoint(second).models())
        run_loop(load_config(REPO / "configs/learn.yaml", args(2)))
        run = RunLayout(tmp_path / "fleet")
        rows = schema.read_table(run.round(1).collect.rollouts, "rollouts").to_pylist()
        assert len(rows) == 12 and not [r for r in rows if r["status"] == "infra_error"], rows
        turns = schema.read_dir(run.round(1).collect.turns, "turns").to_pylist()
        policies = {t["policy"] for t in turns}
        assert len(policies) == 1 and "policy-v1" in policies.pop(), policies
        assert any("policy-v1" in m for m in Endpoint(second).models())  # reloaded where it was lost
    finally:
        procs.stop(engine)
        shared = Endpoint(engine_url)  # the session engine: leave no policy-v<k> for the next test's run
        for name, root in shared.roots().items():
            if root and str(tmp_path) in root:
                shared.unload_adapter(name)
