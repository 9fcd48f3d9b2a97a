"""collect.executor=ray on a real Ray cluster: a head and two worker nodes (separate raylets) in a
network and pid namespace of their own (tests/fixtures/ray_rounds.sh), real harbor trials in the
bubblewrap sandbox, a proxy per node, the vLLM-format stub as the endpoint. The same round runs
locally, on the cluster, in object storage, with one worker's CPU held by other work, and with a
worker node killed while it runs a trial. The workers see an empty datasets/ (a mount namespace
of their own): every task dir reaches them through Ray's object store. The dispatch alone, in
process: test_collect_ray_dispatch.py; a node without a shared filesystem, a machine without Ray:
test_collect_ray_nodes.py."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from wharf.core import schema

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).parent / "fixtures" / "ray_rounds.sh"


def _skip_reason() -> str | None:
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs root, unshare and ip (the cluster runs in a network namespace of its own)"
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install -e '.[ray]')"
    return None


@pytest.fixture(scope="module")
def rounds():
    if (why := _skip_reason()) is not None:
        pytest.skip(why)
    out = Path(tempfile.mkdtemp(prefix="wr."))  # short: Ray's socket paths live under it
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        r = subprocess.run(["unshare", "-n", "-p", "-f", "--kill-child", "--mount-proc", "bash", str(SCRIPT), str(out),
                            sys.executable], cwd=ROOT, env=env, timeout=840,
                           capture_output=True, text=True)
        logs = {p.name: p.read_text()[-2000:] for p in out.glob("*.log")}
        assert r.returncode == 0, f"{r.stdout[-2000:]}\n{r.stderr[-3000:]}\n{logs}"
        got = {name: _round(out / "runs" / name / "rounds" / "0" / "collect")
               for name in ("local", "ray", "busy", "stall", "kill")}
        got["stall"]["log"] = (out / "stall.log").read_text()
        got["flush"] = {**_round(out / "bucket" / "s3" / "wharf" / "runs" / "flush" / "rounds" / "0" / "collect"),
                        "log": (out / "flush.log").read_text()}
        got["held"] = json.loads((out / "held.json").read_text())
        run = out / "bucket" / "s3" / "wharf" / "runs" / "s3"  # the s3 round, as read back from the bucket
        conv = run / "rounds" / "0" / "convert"
        got["s3"] = {**_round(run / "rounds" / "0" / "collect"), "objects": json.loads((out / "bucket.json").read_text()),
                     "index": json.loads((conv / "index.json").read_text()),
                     "stats": json.loads((conv / "stats.json").read_text())}
        ev = run / "evals" / "ray"  # `wharf eval` on the cluster into the same run, read back from the bucket
        got["eval"] = {**_round(ev / "base" / "rounds" / "0" / "collect"), "root": ev,
                       "summary": json.loads((ev / "summary.json").read_text())}
        print({p.stem: p.read_text().strip() for p in out.glob("*.wall")})  # seconds, for docs/scaling.md
        yield got
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _round(collect: Path) -> dict:
    return {
        "manifest": json.loads((collect / "manifest.json").read_text()),
        "rollouts": schema.read_table(collect / "rollouts.parquet", "rollouts").to_pylist(),
        "turns": schema.read_dir(collect / "turns", "turns").to_pylist(),
        "trial_dirs": sorted(p.name for p in (collect / "harbor").iterdir() if p.is_dir()),
        # where each trial read its task dir (harbor's config.json): a node's own copy, when shipped
        "task_paths": {p.parent.name: json.loads(p.read_text())["task"]["path"]
                       for p in (collect / "harbor").glob("*/config.json")},
    }


def _by_key(rnd: dict) -> dict:
    """(task, attempt) -> (group suffix, [(seed, completion ids) per turn])."""
    turns: dict[str, list] = {}
    for t in rnd["turns"]:
        turns.setdefault(t["rollout_id"], []).append(t)
    out = {}
    for r in rnd["rollouts"]:
        mine = sorted(turns.get(r["rollout_id"], []), key=lambda t: t["turn"])
        # every acknowledged call of a recorded rollout is there, once
        why = f"{r['task_id']}.{r['attempt']}: {r['status']} ({r['error']})"  # what the trial met, when it fails
        assert [t["turn"] for t in mine] == list(range(r["n_turns"])) and r["n_turns"] > 0, why
        assert r["group_id"] == f"{r['job_id'][:8]}.{r['task_id']}"
        key = (r["task_id"], r["attempt"])
        assert key not in out, f"{key} recorded twice"
        out[key] = [(json.loads(t["sampling"])["seed"], t["completion_token_ids"]) for t in mine]
    return out


def _same_manifest_shape(local: dict, other: dict) -> None:
    assert set(other) - set(local) == {"executor"}
    for k in ("tasks", "attempts", "agent", "environment", "sampling", "state", "orphan_turns"):
        assert other[k] == local[k], k
    assert other["counts"]["planned"] == other["counts"]["finished"] == 4


def _same_round_on_both_nodes(local: dict, ray: dict) -> None:
    want = _by_key(local)
    got = _by_key(ray)
    assert sorted(want) == sorted(got) == [(t, a) for t in ("sed-add", "write-answer") for a in (0, 1)]
    for key in want:  # the same per-rollout seeds, turn by turn; the same first answer (same prompt, same seed)
        assert [s for s, _ in got[key]] == [s for s, _ in want[key]][:len(got[key])], key
        assert got[key][0] == want[key][0], key
    _same_manifest_shape(local["manifest"], ray["manifest"])
    ex = ray["manifest"]["executor"]
    assert ex["kind"] == "ray" and len(ex["nodes"]) == 2 and ex["lost_nodes"] == []
    assert sorted(ex["trials_by_node"]) == ex["nodes"] and all(n > 0 for n in ex["trials_by_node"].values())
    assert sum(ex["trials_by_node"].values()) == 4
    assert len(ray["trial_dirs"]) == 4  # no trial ran twice


@pytest.mark.slow
def test_a_ray_round_yields_the_local_rounds_rollouts_spread_over_both_nodes(rounds):
    _same_round_on_both_nodes(rounds["local"], rounds["ray"])
    # 4 trials, 4 slots on each node: 2 and 2 (was: all 4 on the first node whose actor was up)
    assert sorted(rounds["ray"]["manifest"]["executor"]["trials_by_node"].values()) == [2, 2]


@pytest.mark.slow
def test_a_ray_round_in_s3_is_whole_in_the_bucket_and_converts_from_there(rounds):
    """Each node and the driver had a mirror of their own: all of it reached the bucket through S3."""
    s3 = rounds["s3"]
    _same_round_on_both_nodes(rounds["local"], s3)  # every node's shards folded in, its trial logs uploaded
    objects = s3["objects"]
    assert {"rounds/0/collect/manifest.json", "rounds/0/collect/rollouts.parquet"} <= set(objects)
    assert any(k.startswith("rounds/0/collect/turns/part-") for k in objects)
    # the nodes' WALs (their admin tokens) and the configs stay on the nodes' disks
    assert not [k for k in objects if "_wal" in k or k.endswith(".yaml")], objects
    job = "s3://wharf/runs/s3/rounds/0/collect"
    # convert, from an empty mirror, read every rollout and turn of the round from the bucket and wrote its
    # index (and the micro-batches of the groups with a signal: the stub's answers may give none) back there
    assert s3["index"]["jobs"] == [job] and s3["stats"]["jobs_read"] == [job]
    assert s3["stats"]["rollouts"]["read"] == 4 and s3["stats"]["turns"]["read"] == len(s3["turns"])
    assert all(f"rounds/0/convert/{f['file']}" in objects for f in s3["index"]["files"])


@pytest.mark.slow
def test_an_eval_on_the_cluster_in_s3_reaches_the_bucket_from_every_node(rounds):
    """`wharf eval` with collect on Ray and runs_dir=s3://, its driver's mirror hidden from the
    workers (was: each node was handed a path in the driver's mirror, which it does not see, and
    refused; on a shared disk its shards and trial logs never went up from the node)."""
    from wharf.pipeline.eval import read_trials
    from wharf.core.layout import RunLayout

    ev = rounds["eval"]
    ex = ev["manifest"]["executor"]
    assert ev["manifest"]["state"] == "done" and ex["lost_nodes"] == [] and len(ex["nodes"]) == 2
    assert sorted(ex["trials_by_node"]) == ex["nodes"]  # one trial on each node
    assert sorted(r["task_id"] for r in ev["rollouts"]) == ["sed-add", "write-answer"]
    assert all(r["status"] == "ok" for r in ev["rollouts"])
    # each node's shards and trial logs, as an empty mirror pulled them from the bucket
    assert {t["rollout_id"] for t in ev["turns"]} == {r["rollout_id"] for r in ev["rollouts"]}
    assert sorted(ev["trial_dirs"]) == sorted(Path(r["trial_dir"]).name for r in ev["rollouts"])
    base = ev["summary"]["policies"]["base"]
    assert base["collect"] == "s3://wharf/runs/s3/evals/ray/base/rounds/0/collect" and base["trials"] == 2
    assert len(read_trials(RunLayout(ev["root"] / "base"), 1)) == 2  # the eval reads back from the pulled copy


@pytest.mark.slow
def test_nodes_that_see_no_dataset_run_the_tasks_the_driver_ships(rounds):
    """The workers' datasets/ is an empty mount: every trial above ran from a shipped task dir."""
    assert rounds["held"]["datasets"] == []
    failed = [(name, r["task_id"], r["status"], r["error"]) for name in ("ray", "s3", "kill")
              for r in rounds[name]["rollouts"] if r["status"] != "ok"]
    assert failed == []
    # each recorded trial ran from the node's unpacked copy of the shipped archive, not the driver's path
    for name in ("ray", "s3", "kill", "stall"):
        paths = rounds[name]["task_paths"]
        assert len(paths) >= 4 and all("/wharf-tasks-" in paths[Path(r["trial_dir"]).name]
                                       for r in rounds[name]["rollouts"]), (name, paths)


@pytest.mark.slow
def test_a_node_whose_cpu_other_work_holds_is_left_out_not_waited_for(rounds):
    """The live cluster with worker 2's one CPU held by another driver's actor: the round's actor
    there never starts; the round starts as soon as worker 1's is up and runs there (it does not
    wait collect.ray_ready_timeout_s=60 for worker 2), and names worker 2 as unavailable."""
    busy, held = rounds["busy"], rounds["held"]["node"]
    ex = busy["manifest"]["executor"]
    assert ex["unavailable_nodes"] == [held] and held in ex["nodes"] and ex["lost_nodes"] == []
    assert list(ex["trials_by_node"]) == [n for n in ex["nodes"] if n != held]
    assert sorted(_by_key(busy)) == sorted(_by_key(rounds["local"]))  # every rollout once
    assert busy["manifest"]["counts"]["by_status"] == {"ok": 4}
    assert busy["manifest"]["wall_s"] < 60  # never waited out the readiness bound


@pytest.mark.slow
def test_a_node_whose_trial_hangs_is_taken_out_at_the_straggler_bound(rounds):
    """The agent hangs on worker 2, by design (tests.fixtures.agents:StallingAgent), and the round
    has collect.ray_trial_timeout_s=20: worker 2 is named lost as stalled once its trial is 20 s
    old, and that trial runs on worker 1; the round neither waits for harbor's 120 s agent timeout
    nor ends."""
    stall, w2 = rounds["stall"], rounds["held"]["node"]
    ex = stall["manifest"]["executor"]
    assert ex["lost_nodes"] == [w2] and w2 in ex["nodes"]
    assert list(ex["trials_by_node"]) == [n for n in ex["nodes"] if n != w2]  # every recorded trial: worker 1's
    assert sorted((r["task_id"], r["attempt"]) for r in stall["rollouts"]) == [("answer", a) for a in range(4)]
    assert stall["manifest"]["counts"]["by_status"] == {"ok": 4}
    assert f"node {w2} stalled (no answer within 20 s)" in stall["log"]
    assert 20 <= stall["manifest"]["wall_s"] < 120
    assert len(stall["trial_dirs"]) >= 5  # the hung try's dir is left, its rollout recorded by the rerun


@pytest.mark.slow
def test_a_node_lost_mid_round_still_yields_every_rollout_once(rounds):
    kill = rounds["kill"]
    got = _by_key(kill)  # each (task, attempt) once, with all its turns
    assert sorted(got) == sorted(_by_key(rounds["local"]))
    assert all(r["status"] == "ok" for r in kill["rollouts"])
    ex = kill["manifest"]["executor"]
    assert len(ex["lost_nodes"]) == 1 and ex["lost_nodes"][0] in ex["nodes"]
    assert sum(ex["trials_by_node"].values()) == 4
    survivor = next(n for n in ex["nodes"] if n not in ex["lost_nodes"])
    assert ex["trials_by_node"][survivor] >= 3  # its own and the lost node's unfinished one
    # the lost node's unfinished try ran again under a fresh rollout id
    recorded = {r["rollout_id"] for r in kill["rollouts"]}
    abandoned = [d for d in kill["trial_dirs"] if d not in recorded]
    assert len(abandoned) >= 1
    # none of its calls counts: convert reads only turns of recorded rollouts
    assert not any(t["rollout_id"] in abandoned for t in kill["turns"]) or kill["manifest"]["orphan_turns"] > 0
    assert kill["manifest"]["counts"]["by_status"] == {"ok": 4}


@pytest.mark.slow
def test_a_node_whose_turns_cannot_reach_the_bucket_counts_no_trial_done(rounds):
    """Worker 2's shard uploads answer 503 in the run `flush` (tests/fixtures/ray_rounds.sh): its
    trial's rows stay in its WAL, so the trial does not count (was: the close answered OK, the row
    was recorded, and the round ended done with a scored rollout whose turns never reached the
    bucket, which no resume reruns); worker 2 is retired once the task runs on worker 1."""
    fl, w2 = rounds["flush"], rounds["held"]["node"]
    ex = fl["manifest"]["executor"]
    assert fl["manifest"]["state"] == "done" and ex["lost_nodes"] == [w2] and w2 in ex["nodes"]
    assert list(ex["trials_by_node"]) == [n for n in ex["nodes"] if n != w2]
    # every recorded rollout has all its turns in the bucket, as an empty mirror read them back
    assert sorted(_by_key(fl)) == [("sed-add", 0), ("write-answer", 0)]
    assert all(r["status"] == "ok" and r["n_errors"] == 0 for r in fl["rollouts"])
    assert "could not be published from this node" in fl["log"]
