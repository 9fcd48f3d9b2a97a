"""The records a later step reads reach the bucket (a real S3 server): publish's record of which
replicas serve a policy, and an eval's summary.json; a machine with an empty mirror reads them,
and an overlapped loop resumed there goes on where the bucket says it stands."""
from __future__ import annotations

import json
import logging

import pytest

from wharf.pipeline.eval import Policy, eval_name, write_summary
from wharf.pipeline.eval_stats import Trial
from wharf.core import schema, storage
from wharf.core.config import load_config
from wharf.core.layout import RunLayout
from wharf.core.replicas import PublishRecord, ReplicaResult


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


def test_an_evals_policy_round_names_the_bucket_so_each_node_works_in_its_own_mirror(monkeypatch, tmp_path):
    """The collect round of an eval in object storage goes to collect (and Ray's nodes) by its URL:
    on the driver it lands where the eval reads it, on a node in the node's own mirror, from
    which the node uploads (was: the driver's mirror path, no node's and no URL on a node)."""
    from wharf.pipeline.eval import policy_config

    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "driver"))
    cfg = load_config(None, ["runs_dir=s3://b/runs", "name=r", "eval.dataset=datasets/learn/heldout"])
    ev = cfg.layout.eval("e")
    pcfg = policy_config(cfg, ev, Policy("base", "base", None, 0), "m")
    assert pcfg.runs_dir == "s3://b/runs/r/evals/e"
    assert pcfg.round_layout.collect.root == ev.policy("base").round(0).collect.root
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "node"))
    on_node = pcfg.round_layout.collect.root
    assert on_node.is_relative_to(tmp_path / "node")
    assert storage.url_of(on_node) == "s3://b/runs/r/evals/e/base/rounds/0/collect"
    local = load_config(None, [f"runs_dir={tmp_path}/runs", "eval.dataset=datasets/learn/heldout"])
    assert policy_config(local, local.layout.eval("e"), Policy("base", "base", None, 0), "m").runs_dir == \
        str(local.layout.eval("e").root)


def test_a_run_in_the_bucket_is_evaluated_from_an_empty_mirror(s3, monkeypatch, tmp_path, capsys):
    """`wharf eval eval.policies=[s3://.../runs/grpo:2]` on a machine whose mirror is empty (as a
    loop's eval resumed there, whose publish was done): the adapter and the trials the run's own
    loop already evaluated come from the bucket (was: the URL was taken for a local path, and an
    adapter never pulled "held no adapter")."""
    from conftest import REPO, free_port
    from wharf.pipeline.eval import main, resolve
    from test_eval import _loop_eval_job

    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "first"))
    run = RunLayout.of(f"{s3}/runs", "grpo")
    adapter = run.round(1).train.adapter
    adapter.mkdir(parents=True)
    (adapter / "adapter_model.safetensors").write_bytes(b"the weights of grpo's policy-v2")
    (adapter / "adapter_config.json").write_text("{}")
    _loop_eval_job(run, 2, {"a": 4, "b": 3})
    storage.push(run.root)
    digest = resolve(f"{run.root}:2").digest

    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "second"))
    mirrored = RunLayout.of(f"{s3}/runs", "grpo")
    p = resolve(f"{mirrored.root}:2")  # as the loop names its own run: its mirror's path
    assert (p.adapter, p.digest, p.label) == (mirrored.round(1).train.adapter, digest, f"grpo-policy-v2-{p.sha256[:8]}")
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "third"))
    args = ["--config", str(REPO / "configs/learn.yaml"), f"runs_dir={s3}/runs", "name=cmp", "eval.attempts=4",
            "eval.dataset=datasets/learn/heldout", "sampling.seed=3", "endpoint.launch=false",
            f"endpoint.url=http://127.0.0.1:{free_port()}", f"eval.policies=[{s3}/runs/grpo:2]"]
    assert main(args) == 0  # nothing answers at the endpoint: the loop's stored trials were read
    assert "reward 0.875" in capsys.readouterr().out
    entry = json.loads(storage.get(f"{s3}/runs/cmp/evals/learn-heldout/summary.json"))["policies"][p.label]
    assert entry["collect"] == f"{s3}/runs/grpo/evals/learn-heldout/grpo-policy-v2/rounds/0/collect"
    assert entry["adapter"] == f"{s3}/runs/grpo/rounds/1/train/adapter"


def test_an_evals_own_finished_job_in_the_bucket_is_read_on_another_machine(s3, monkeypatch, tmp_path, capsys, caplog):
    """`wharf eval` re-run on a machine whose mirror is empty, its own job for the policy done in the
    bucket: the trials are read from there, with no adapter loaded (nothing answers at the
    endpoint; was: the local mirror alone was checked, and the adapter was loaded first)."""
    from conftest import REPO, free_port
    from wharf.core.names import weights_digest
    from wharf.pipeline.eval import main, resolve
    from test_report import _rollouts

    run = RunLayout.of(f"{s3}/runs", "grpo")
    adapter = run.round(1).train.adapter
    adapter.mkdir(parents=True)
    (adapter / "adapter_model.safetensors").write_bytes(b"the weights of grpo's policy-v2")
    (adapter / "adapter_config.json").write_text("{}")
    storage.push(run.root)
    job = RunLayout.of(f"{s3}/runs", "cmp").eval("learn-heldout").policy("grpo-policy-v2").round(0).collect
    schema.write_table(job.rollouts, "rollouts", _rollouts(0, {"a": 2, "b": 1}))
    job.manifest.write_text(json.dumps({
        "state": "done", "dataset": "datasets/learn/heldout", "attempts": 4, "agent": "wharf.collect.agents.minimal:MinimalAgent",
        "environment": "wharf.collect.sandbox.bwrap:BwrapEnvironment", "sampling": {"temperature": 0.7, "top_p": 1.0, "seed": 3},
        "policy": f"eval-{weights_digest(adapter)[:12]}"}))  # an eval from before labels carried the weights
    storage.push(job.root)
    label = resolve(f"{run.root}:2").label

    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "second"))
    args = ["--config", str(REPO / "configs/learn.yaml"), f"runs_dir={s3}/runs", "name=cmp", "eval.attempts=4",
            "eval.dataset=datasets/learn/heldout", "sampling.seed=3", "endpoint.launch=false",
            f"endpoint.url=http://127.0.0.1:{free_port()}", f"eval.policies=[{s3}/runs/grpo:2]"]
    caplog.set_level(logging.INFO, logger="wharf.eval")
    assert main(args) == 0
    assert "reward 0.375" in capsys.readouterr().out
    assert "grpo:2: its trials are already in this eval" in caplog.text  # its own job, not its run's loop's
    entry = json.loads(storage.get(f"{s3}/runs/cmp/evals/learn-heldout/summary.json"))["policies"][label]
    assert entry["collect"] == f"{s3}/runs/cmp/evals/learn-heldout/grpo-policy-v2/rounds/0/collect"


def test_a_converted_round_resumed_on_an_empty_mirror_reads_its_index_from_the_bucket(s3, monkeypatch, tmp_path):
    from wharf.pipeline.stages import has_signal
    from wharf.train.stage import convert_dir
    from wharf.core.batches import BatchFile, BatchIndex, write_index

    cfg = load_config(None, [f"runs_dir={s3}/runs", "name=r", "round=0"])
    d = convert_dir(cfg)
    d.mkdir(parents=True)
    write_index(BatchIndex(files=[BatchFile("mb-0.pt", 2, 8, 12, 5, 2.0)]), d / "index.json")
    storage.push(d, last=("index.json",))
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "other-machine"))  # the loop resumed elsewhere
    assert has_signal(cfg)  # was: "no index.json; run convert on this round first"


def test_a_converted_round_resumed_on_an_empty_mirror_checks_its_lag_on_the_bucket_index(s3, monkeypatch, tmp_path):
    """The overlapped loop's lag check before train (train_checked) read index.json from the mirror:
    a round converted but not trained when the loop was killed failed there on another machine."""
    from wharf.pipeline.loop import train_checked
    from wharf.pipeline.overlap import StaleRowsError
    from wharf.train.stage import convert_dir
    from wharf.core.batches import BatchFile, BatchIndex, write_index

    over = [f"runs_dir={s3}/runs", "name=r", "round=2", "loop.max_staleness=1"]
    d = convert_dir(load_config(None, over))
    d.mkdir(parents=True)
    rows = [{"rollout_id": "x", "policy": "policy-v1"}, {"rollout_id": "y", "policy": "policy-v0"}]
    write_index(BatchIndex(files=[BatchFile("mb-0.pt", 2, 8, 12, 5, 2.0)], rollouts=rows), d / "index.json")
    storage.push(d, last=("index.json",))
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "other-machine"))
    with pytest.raises(StaleRowsError, match=r"1 rollouts by policy-v0 \(2 behind\)"):  # was: no index.json
        train_checked(load_config(None, over))


def test_the_health_checks_of_a_finished_round_read_its_files_from_the_bucket(s3, monkeypatch, tmp_path):
    """A loop resumed on an empty mirror checked its finished rounds on missing files, failed them,
    and pushed the failing health.json over the good one: the files the checks read are pulled first."""
    from wharf.pipeline.loop import health_inputs

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


def _stored_overlapped_run(s3, monkeypatch, tmp_path) -> tuple[list[str], RunLayout]:
    """Rounds 0 and 1 of a max_staleness=1 loop, finished, and round 2's collect killed after it
    started from policy-v1 (its manifest says so): in the bucket, written from a first machine;
    the caller goes on from an empty mirror, as on another machine."""
    from test_health import write_round
    from test_overlap import BASE, _overlapped_round

    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "first-machine"))
    layout = RunLayout.of(f"{s3}/runs", "run")
    write_round(layout.round(0), BASE, {"a": 1, "b": 2})
    _overlapped_round(layout, 1, BASE, 1)
    layout.round(2).collect.root.mkdir(parents=True)
    layout.round(2).collect.manifest.write_text(json.dumps({"policy": "policy-v1", "state": "running"}))
    storage.push(layout.root)
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "second-machine"))
    return [f"runs_dir={s3}/runs", "name=run", "loop.max_staleness=1", "endpoint.launch=false"], RunLayout.of(
        f"{s3}/runs", "run")


def test_an_overlapped_loop_resumed_on_another_machine_takes_its_rounds_from_the_bucket(s3, stub, monkeypatch, tmp_path):
    """Finished rounds are not run again (their markers, then health's inputs, come from the
    bucket, and every check passes on them); the killed collect resumes with the policy it
    started with (was: the empty mirror had no manifest, so it took the newest policy)."""
    from wharf.pipeline.loop import round_config
    from wharf.pipeline.overlap import Collector

    over, layout = _stored_overlapped_run(s3, monkeypatch, tmp_path)
    storage.pull(layout.root, ("rounds/*/done/*.json",))  # where each round stands, as run_loop starts
    cfg, policies, served = load_config(None, [*over, "rounds=3"]), [], []
    monkeypatch.setattr(Collector, "_child_collect", lambda self, rcfg: policies.append(rcfg.collect.policy) or True)
    with Collector(cfg, lambda j, p: round_config(cfg, j, p), lambda c, v: served.append(v)) as c:
        c.published.set(2)  # policy-v2 is out by now: a fresh collect would take it
        got, _ = c.wait(2)
    assert (got.policy, got.lag) == ("policy-v1", 1) and policies == ["policy-v1"] and served == [1]
    _resume_finished(s3, stub, monkeypatch, over)


def test_a_loop_resumed_on_another_machine_runs_no_finished_round_again(s3, stub, monkeypatch, tmp_path):
    """The same for the synchronous loop (loop.max_staleness=0): rounds 0 and 1 by the base model
    and policy-v1, every stage marked done, in the bucket only."""
    from test_health import write_round
    from test_overlap import BASE

    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "first-machine"))
    layout = RunLayout.of(f"{s3}/runs", "run")
    for k, policy in enumerate((BASE, "policy-v1")):
        write_round(layout.round(k), policy, {"a": 1, "b": 2})
    storage.push(layout.root)
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "second-machine"))
    _resume_finished(s3, stub, monkeypatch, [f"runs_dir={s3}/runs", "name=run", "endpoint.launch=false"])


def _resume_finished(s3, stub, monkeypatch, over: list[str]) -> None:
    """run_loop for rounds 0-1, all finished in the bucket: nothing runs again, health passes."""
    from wharf.pipeline.loop import run_loop

    served = []  # the stub loads no adapter: record what the loop asks to serve
    monkeypatch.setattr("wharf.pipeline.loop.ensure_served", lambda ep, cfg, v: served.append(v))
    for stage in ("collect_stage", "convert_stage", "train_checked", "publish_stage"):
        monkeypatch.setattr(f"wharf.pipeline.loop.{stage}", lambda *a, **k: pytest.fail("a finished round ran again"))
    assert run_loop(load_config(None, [*over, "rounds=2", f"endpoint.url={stub.url}", "loop.check_model=false"])) == [0, 1]
    assert served == [2]
    for k in (0, 1):  # checked on the bucket's files, and the passing health.json pushed
        assert all(c["ok"] for c in json.loads(storage.get(f"{s3}/runs/run/rounds/{k}/health.json"))), k


def test_a_round_trained_again_is_published_again(s3, monkeypatch, tmp_path):
    """Its train marker removed (the way to train a round again), the round's publish marker is
    dropped too, here and in the bucket: publish runs, and checks the replicas' weights (was:
    skipped, the replicas kept the first training's weights under the same name)."""
    from wharf.pipeline import loop
    from wharf.pipeline.stages import write_marker

    cfg = load_config(None, [f"runs_dir={s3}/runs", "name=r", "round=0"])
    rnd = cfg.layout.round(0)
    for stage in ("convert", "publish"):
        write_marker(rnd, stage, 1.0)
    published = []
    monkeypatch.setattr(loop, "train_checked", lambda c: {"steps": 1})
    monkeypatch.setattr(loop, "measure_shift", lambda c: None)
    monkeypatch.setattr(loop, "publish_stage", lambda c, ep: published.append(c.round) or {"published": True})
    loop.learn_round(cfg, None)
    assert published == [0] and "rounds/0/done/publish.json" in storage.listing(f"{s3}/runs/r")
    loop.learn_round(cfg, None)  # nothing trained this time: nothing published again
    assert published == [0]
