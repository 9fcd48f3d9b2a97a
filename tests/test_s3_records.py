"""The records a later step reads reach the bucket (a real S3 server): publish's record of which
replicas serve a policy, and an eval's summary.json; a machine with an empty mirror reads them."""
from __future__ import annotations

import json

from pipeline.eval import Policy, eval_name, write_summary
from pipeline.eval_stats import Trial
from wharf import storage
from wharf.config import load_config
from wharf.layout import RunLayout
from wharf.replicas import PublishRecord, ReplicaResult


def test_a_publish_record_goes_up_and_is_read_on_another_machine(s3, monkeypatch, tmp_path):
    path = RunLayout.of(f"{s3}/runs", "r").published("policy-v1")
    PublishRecord("policy-v1", "/a", [ReplicaResult("http://r1", True), ReplicaResult("http://r2", False, "404")]).write(path)
    assert "published/policy-v1.json" in storage.listing(f"{s3}/runs/r")
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "other-machine"))
    record = PublishRecord.read(RunLayout.of(f"{s3}/runs", "r").published("policy-v1"))
    assert record is not None and record.refused == {"http://r2": "404"}
    assert PublishRecord.read(RunLayout.of(f"{s3}/runs", "r").published("policy-v2")) is None


def test_an_eval_summary_goes_up_and_a_later_call_on_another_machine_keeps_its_policies(s3, monkeypatch, tmp_path):
    cfg = load_config(None, [f"runs_dir={s3}/runs", "eval.dataset=datasets/learn/heldout", "eval.attempts=1"])
    ev = cfg.layout.eval(eval_name(cfg))
    trials = [Trial("a", 0, 1.0), Trial("b", 0, 0.0)]
    write_summary(ev, cfg, {"base": (Policy("base", "base", None, 0), trials, ev.policy("base"))})
    key = f"{cfg.name}/evals/{ev.root.name}/summary.json"
    assert key in storage.listing(f"{s3}/runs")
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "other-machine"))
    ev2 = load_config(None, [f"runs_dir={s3}/runs", "eval.dataset=datasets/learn/heldout"]).layout.eval(ev.root.name)
    write_summary(ev2, cfg, {"x": (Policy("runs/R:1", "x", tmp_path, 1), trials, ev2.policy("x"))})
    assert set(json.loads(storage.get(f"{s3}/runs/{key}"))["policies"]) == {"base", "x"}


def test_a_converted_round_resumed_on_an_empty_mirror_reads_its_index_from_the_bucket(s3, monkeypatch, tmp_path):
    from pipeline.stages import has_signal
    from train.stage import convert_dir
    from wharf.batches import BatchFile, BatchIndex, write_index

    cfg = load_config(None, [f"runs_dir={s3}/runs", "name=r", "round=0"])
    d = convert_dir(cfg)
    d.mkdir(parents=True)
    write_index(BatchIndex(files=[BatchFile("mb-0.pt", 2, 8, 12, 5, 2.0)]), d / "index.json")
    storage.push(d, last=("index.json",))
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "other-machine"))  # the loop resumed elsewhere
    assert has_signal(cfg)  # was: "no index.json; run convert on this round first"


def test_the_health_checks_of_a_finished_round_read_its_files_from_the_bucket(s3, monkeypatch, tmp_path):
    """A loop resumed on an empty mirror checked its finished rounds on missing files, failed them,
    and pushed the failing health.json over the good one: the files the checks read are pulled first."""
    from pipeline.loop import health_inputs

    rnd = RunLayout.of(f"{s3}/runs", "r").round(0)
    made = [rnd.collect.manifest, rnd.collect.rollouts, rnd.collect.turns / "part-1.parquet", rnd.convert.stats,
            rnd.train.result, rnd.train.metrics, rnd.train.shift, rnd.marker("train")]
    for f in made:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("{}")
    (rnd.collect.root / "harbor").mkdir()
    (rnd.collect.root / "harbor" / "trial.log").write_text("not read by the checks")
    storage.push(rnd.root)
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "other-machine"))
    rnd2 = RunLayout.of(f"{s3}/runs", "r").round(0)
    assert storage.pull(rnd2.root, health_inputs(rnd2)) == len(made)
    assert all((rnd2.root / f.relative_to(rnd.root)).is_file() for f in made)
    assert not (rnd2.collect.root / "harbor").exists()
