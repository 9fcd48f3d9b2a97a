"""Two real local engines as one fleet (issue #36): a 2-round loop whose second replica restarts
between rounds (its runtime LoRAs gone). Round 1 is served by policy-v1 on both, with the
trainer's log-probs (the loop's health checks, max_served_mismatch on), and no trial is lost.
Then `wharf eval` of the run's newest policy against the base on the same two replicas: its
adapter is loaded on both (eval's proxy routes to both), every trial is scored."""
from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import pytest

from wharf.core import procs, schema
from wharf.core.config import load_config
from wharf.core.endpoint import Endpoint
from wharf.core.layout import RunLayout
from conftest import REPO, free_port
from wharf.pipeline.eval import UNSCORED, main as eval_main, owner_of, resolve
from wharf.pipeline.loop import run_loop

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")]
CONFIG = REPO / "configs/learn.yaml"
TASKS = ("sed-sub", "echo-number", "sed-world")  # round 0 on seed 0 has a group with signal: policy-v1 is trained


def _engine(port: int, log: Path):
    proc = procs.spawn([sys.executable, "-m", "wharf.engine", "--config", str(CONFIG),
                        f"engine.port={port}", "engine.threads=1"], log, cwd=REPO)
    Endpoint(f"http://127.0.0.1:{port}").wait_healthy(300, proc, log)
    return proc


def test_a_replica_restarted_between_rounds_serves_the_policy_again_and_eval_loads_on_both(engine_url, tmp_path,
                                                                                         caplog):
    port = free_port()
    second = f"http://127.0.0.1:{port}"
    fleet = [f"runs_dir={tmp_path}", "name=fleet", f"endpoint.url={engine_url}", "endpoint.launch=false",
             f"proxy.upstreams=[{second}]", f"proxy.port={free_port()}"]
    args = lambda rounds: [  # noqa: E731
        *fleet, f"rounds={rounds}", f"collect.tasks=[{','.join(TASKS)}]", "collect.attempts=2",
        "collect.concurrency=6", "train.rows_per_step=2", "convert.max_tokens_per_batch=512",
        "loop.health.max_served_mismatch=0.1"]
    engine = _engine(port, tmp_path / "engine.log")
    try:
        run_loop(load_config(CONFIG, args(1)))
        procs.stop(engine)
        engine = _engine(port, tmp_path / "engine2.log")  # the same replica, its LoRAs gone
        assert not any("policy-v1" in m for m in Endpoint(second).models())
        run_loop(load_config(CONFIG, args(2)))
        run = RunLayout(tmp_path / "fleet")
        rows = schema.read_table(run.round(1).collect.rollouts, "rollouts").to_pylist()
        assert len(rows) == 2 * len(TASKS) and not [r for r in rows if r["status"] == "infra_error"], rows
        turns = schema.read_dir(run.round(1).collect.turns, "turns").to_pylist()
        policies = {t["policy"] for t in turns}
        assert len(policies) == 1 and "policy-v1" in policies.pop(), policies
        assert any("policy-v1" in m for m in Endpoint(second).models())  # reloaded where it was lost

        _eval_on_both(fleet, tmp_path, engine_url, second, caplog=caplog)
    finally:
        procs.stop(engine)
        shared = Endpoint(engine_url)  # the session engine: leave no policy-v<k> for the next test's run
        for name, root in shared.roots().items():
            if root and str(tmp_path) in root:
                shared.unload_adapter(name)


def _eval_on_both(fleet: list[str], tmp_path: Path, *replicas: str, caplog) -> None:
    """`wharf eval` (in process) of policy-v2 and the base on two of the loop's tasks, one attempt."""
    evalset = tmp_path / "evalset"
    evalset.mkdir()
    for task in TASKS[:2]:
        (evalset / task).symlink_to(REPO / "datasets/learn" / task)
    newest = resolve(f"{tmp_path / 'fleet'}:2")
    base = load_config(CONFIG, []).endpoint.model
    ev = RunLayout(tmp_path / "fleet").eval("fleet")
    served = {"base": base, newest.label: newest.served_name(base, owner_of(ev.policy(newest.label)))}  # this eval's own
    caplog.set_level(logging.INFO, logger="wharf.eval")
    assert eval_main(["--config", str(CONFIG), *fleet, f"eval.dataset={evalset}", "eval.name=fleet", "eval.attempts=1",
                      f"eval.policies=[base,{newest.spec}]"]) == 0
    summary = json.loads(ev.summary.read_text())
    for label, name in served.items():
        job = ev.policy(label).round(0).collect
        rows = schema.read_table(job.rollouts, "rollouts").to_pylist()
        assert sorted(r["task_id"] for r in rows) == sorted(TASKS[:2]), rows
        assert not [r for r in rows if r["status"] in UNSCORED], rows  # every trial scored, none dropped
        assert summary["policies"][label]["trials"] == 2
        assert {t["policy"] for t in schema.read_dir(job.turns, "turns").to_pylist()} == {name}, label
    name = served[newest.label]
    loads = [r.getMessage() for r in caplog.records if r.name == "wharf.eval" and f"as {name} on" in r.getMessage()]
    assert sorted(m.rpartition(" on ")[2] for m in loads) == sorted(replicas), loads  # loaded on both replicas
    assert not [r for r in caplog.records if r.name == "wharf.eval" and "refused" in r.getMessage()]  # none routed around
    assert f"loaded LoRA adapter {name}" in (tmp_path / "engine2.log").read_text()  # the replica's own word
    assert f"unloaded LoRA adapter {name}" in (tmp_path / "engine2.log").read_text()
    assert not any(name in m for r in replicas for m in Endpoint(r).models())  # unloaded from both after
