"""Runs in object storage end to end, against a real S3 server (SeaweedFS on 127.0.0.1): a collect
round of real harbor trials through the real recording proxy written to s3://, then convert,
train, report and replay each run as `wharf <command>` on "another machine" (an empty local
mirror) with runs_dir=s3://..., reading and writing only the bucket."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testing.synthetic_job import make_job
from wharf.core import schema, storage
from wharf.core.config import dump_config, load_config
from conftest import REPO, free_port

pytestmark = pytest.mark.slow

TASKS = Path(__file__).parent / "fixtures" / "tasks"


def wharf(tmp_path: Path, node: str, *args: str) -> subprocess.CompletedProcess:
    """`wharf ARGS` on a machine whose local disk is tmp_path/node (its mirror starts empty)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "WHARF_MIRROR": str(tmp_path / node)}
    out = subprocess.run([sys.executable, "-m", "wharf.pipeline.cli", *args], cwd=REPO, capture_output=True, text=True,
                         timeout=900, env=env)
    assert out.returncode == 0, f"wharf {' '.join(args)}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def bucket_json(url: str) -> dict:
    return json.loads(storage.get(url))


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
def test_a_collect_round_writes_to_s3_and_converts_from_there(s3, stub, tmp_path):
    from wharf.collect.runner import Round

    runs = f"{s3}/runs"
    cfg = load_config(None, [
        f"runs_dir={runs}", "name=t", f"endpoint.url={stub.url}", "endpoint.model=stub-model",
        f"proxy.port={free_port()}", f"collect.dataset={TASKS}", "collect.agent=tests.fixtures.agents:ScriptedAgent",
        "collect.concurrency=2", "collect.tasks=[answer]", "collect.attempts=3", "collect.agent_kwargs={calls: 2}"])
    dump_config(cfg, tmp_path / "config.yaml")
    summary = asyncio.run(Round(cfg, tmp_path / "config.yaml").run(progress=False))
    assert len(summary.rows) == 3

    job = f"{runs}/t/rounds/0/collect"
    objects = storage.listing(job)
    shards = [k for k in objects if k.startswith("turns/part-")]
    assert len(shards) == 1, objects  # the proxy's per-rollout shards, folded into one
    # the WAL, and the configs (API keys, the proxy's admin token), stay on the node
    assert not [k for k in objects if "_wal" in k or k.endswith(".yaml")], objects
    manifest = bucket_json(f"{job}/manifest.json")
    assert manifest["state"] == "done" and manifest["counts"]["by_status"] == {"ok": 3}
    # the bucket's rows are the round's rows: every call of every rollout, nothing twice
    other = tmp_path / "reader"
    (other / "turns").mkdir(parents=True)
    for name in ("rollouts.parquet", shards[0]):
        (other / name).write_bytes(storage.get(f"{job}/{name}"))
    rollouts = schema.read_table(other / "rollouts.parquet", "rollouts").to_pylist()
    turns = schema.read_dir(other / "turns", "turns").to_pylist()
    assert sorted(r["rollout_id"] for r in rollouts) == sorted(r.rollout_id for r in summary.rows)
    assert sorted((t["rollout_id"], t["turn"]) for t in turns) == sorted(
        (r["rollout_id"], k) for r in rollouts for k in range(2))
    assert any(k.startswith("harbor/") for k in objects)  # the trials' logs, named by rollouts.trial_dir

    out = wharf(tmp_path, "convert-node", "convert", f"runs_dir={runs}", "name=t")
    assert f"{runs}/t/rounds/0/convert" in out.stdout
    stats = bucket_json(f"{runs}/t/rounds/0/convert/stats.json")
    assert stats["rollouts"]["read"] == 3 and stats["turns"]["read"] == 6 and stats["jobs_read"] == [job]
    assert bucket_json(f"{runs}/t/rounds/0/convert/index.json")["jobs"] == [job]


@pytest.fixture
def s3_job(s3, tmp_path) -> str:
    """A stored round in the bucket (generated rollouts with mixed rewards): s3://.../runs/src/rounds/0/collect."""
    url = f"{s3}/runs/src/rounds/0/collect"
    local = tmp_path / "maker" / "collect"
    make_job(local, 8, seed=3, shards=2, size=0.02, turns=(2, 3))  # one group, rewards mixed
    (local / "manifest.json").write_text(json.dumps({"job_id": "bench-3", "agent": "synthetic", "state": "done"}))
    for f in sorted(local.rglob("*")):
        if f.is_file():
            storage.put(f"{url}/{f.relative_to(local).as_posix()}", f.read_bytes())
    return url


TRAIN = ["train.rows_per_step=8", "train.publish=false", "train.grad_checkpointing=false", "train.device=cpu"]


def test_train_and_report_read_and_write_s3(s3, s3_job, tmp_path):
    runs = f"{s3}/runs"
    out = wharf(tmp_path, "trainer", "train", f"runs_dir={runs}", "name=src", *TRAIN)
    train = f"{runs}/src/rounds/0/train"
    objects = storage.listing(train)
    assert {"adapter/adapter_config.json", "adapter/adapter_model.safetensors", "result.json",
            "metrics.jsonl"} <= set(objects), objects
    assert not [k for k in objects if k.startswith("checkpoint/") or k.startswith(".")]
    result = bucket_json(f"{train}/result.json")
    assert result["steps"] > 0 and result["adapter"] == f"{train}/adapter" and f"{train}/adapter" in out.stdout
    assert "index.json" in storage.listing(f"{runs}/src/rounds/0/convert")  # train converted first, into the bucket

    # the report, written from yet another machine, lands beside the run
    out = wharf(tmp_path, "reporter", "report", f"{runs}/src")
    assert f"{runs}/src/report.html" in out.stdout
    page = storage.get(f"{runs}/src/report.html").decode()
    assert "wharf run src" in page and "No rounds yet" not in page
    pngs = [k for k in storage.listing(f"{runs}/src/report") if k.endswith(".png")]
    assert pngs and all(f"report/{p}" in page for p in pngs)


def test_replay_of_a_job_in_s3_into_s3(s3, s3_job, tmp_path):
    runs = f"{s3}/runs"
    wharf(tmp_path, "replayer", "replay", "--job", s3_job, f"runs_dir={runs}", "name=rp", *TRAIN)
    rp_objects = storage.listing(f"{runs}/rp")
    assert {"rounds/0/train/adapter/adapter_config.json", "rounds/0/train/offpolicy.json", "report.html",
            "rounds/0/done/train.json"} <= set(rp_objects), rp_objects
    assert not [k for k in rp_objects if k.endswith(".yaml")]
    assert bucket_json(f"{runs}/rp/rounds/0/convert/index.json")["jobs"] == [s3_job]


def test_a_missing_bucket_is_named_by_the_command(s3, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "WHARF_MIRROR": str(tmp_path / "m")}
    out = subprocess.run([sys.executable, "-m", "wharf.pipeline.cli", "convert", "runs_dir=s3://no-such-bucket-wharf/runs",
                          "name=x"], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 1
    assert "wharf convert: s3://no-such-bucket-wharf/runs/x/rounds/0/collect: cannot open the bucket: " \
           "the bucket does not exist" in out.stderr
