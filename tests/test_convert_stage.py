"""convert_round on real parquet jobs (generated through wharf.schema): the micro-batches and
index train reads, replay of mixed jobs, determinism, and bad input refused by name with nothing
written (or skipped and listed with convert.skip_bad)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from wharf.core import schema
from wharf.core.config import load_config
from wharf.core.layout import CollectPaths
from testing.synthetic_job import make_job
from wharf.convert.reader import ConvertInputError
from wharf.core.batches import load_micro_batch, read_index
from wharf.convert.stage import convert_round, summary

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    base = tmp_path_factory.mktemp("jobs")
    for seed in (1, 2):
        make_job(base / f"job{seed}", 16, seed=seed, shards=2, size=0.05, turns=(2, 6))
    return base


def copy_job(jobs, tmp_path, name="job1") -> Path:
    return Path(shutil.copytree(jobs / name, tmp_path / name))


def cfg_for(dirs, out, *extra):
    return load_config(None, [f"convert.jobs=[{','.join(str(d) for d in dirs)}]", f"convert.out_dir={out}",
                              "convert.max_tokens_per_batch=2048", "convert.pad_multiple=8", *extra])


def test_batches_hold_every_used_row_once(jobs, tmp_path):
    stats = convert_round(cfg_for([jobs / "job1"], tmp_path / "out"), progress=False)
    index = read_index(tmp_path / "out")
    assert json.loads((tmp_path / "out/stats.json").read_text()) == stats
    assert index.n_rows == stats["rows"]["count"] > 0 and index.loss_tokens == stats["tokens"]["trainable"]
    weight_per_rollout = np.zeros(len(index.rollouts))
    for f in index.files:
        mb = load_micro_batch(tmp_path / "out" / f.file)
        b, t = mb.shape
        assert t % 8 == 0 and b * t <= 2048 or b == 1
        assert int(mb.attention_mask.sum()) == f.tokens and int(mb.completion_mask.sum()) == f.loss_tokens
        np.add.at(weight_per_rollout, mb.rollout_index.numpy(), mb.weights.numpy())
        for i in range(b):
            r = index.rollouts[int(mb.rollout_index[i])]
            assert float(mb.advantages[i]) == pytest.approx(r["advantage"], abs=1e-6)
            assert index.groups[int(mb.group_index[i])] == r["group_id"]
    np.testing.assert_allclose(weight_per_rollout, 1.0, rtol=1e-6)  # a split rollout counts once
    assert stats["rows"]["merged"] > 0 and stats["prefix_breaks"]["total"] > 0
    assert stats["batches"]["padding_fraction"] < stats["batches"]["naive_padding_fraction"]


def test_same_seed_same_batches_and_zero_control(jobs, tmp_path):
    a = convert_round(cfg_for([jobs / "job1"], tmp_path / "a"), progress=False)
    convert_round(cfg_for([jobs / "job1"], tmp_path / "b"), progress=False)
    assert read_index(tmp_path / "a") == read_index(tmp_path / "b")
    for f in read_index(tmp_path / "a").files:  # (the safetensors header's key order varies: compare tensors)
        ta, tb = (load_micro_batch(tmp_path / d / f.file).tensors() for d in "ab")
        assert all(torch.equal(ta[k], tb[k]) for k in ta)
    z = convert_round(cfg_for([jobs / "job1"], tmp_path / "z", "convert.advantage=zero"), progress=False)
    assert z["groups"] == a["groups"] and z["rows"]["count"] == a["rows"]["count"]  # the same groups kept
    assert all(r["advantage"] == 0.0 for r in read_index(tmp_path / "z").rollouts)


def test_replay_mixes_jobs_without_merging_their_groups(jobs, tmp_path):
    one = convert_round(cfg_for([jobs / "job1"], tmp_path / "one"), progress=False)
    both = convert_round(cfg_for([jobs / "job1", jobs / "job2"], tmp_path / "both"), progress=False)
    index = read_index(tmp_path / "both")
    # both jobs name their groups task-0000, task-0001: qualified by job they stay apart
    assert {g.split("/")[0] for g in index.groups} == {"bench-1", "bench-2"}
    assert [j["rollouts"] for j in both["jobs"]] == [16, 16] and both["rollouts"]["read"] == 32
    assert both["jobs"][0]["used"] == one["rollouts"]["used"]
    with pytest.raises(ConvertInputError, match="the same job twice"):
        convert_round(cfg_for([jobs / "job1", copy_job(jobs, tmp_path)], tmp_path / "dup"), progress=False)


def test_orphan_turns_are_ignored_and_counted(jobs, tmp_path):
    job = copy_job(jobs, tmp_path)
    rows = schema.read_table(CollectPaths(job).rollouts, "rollouts")
    schema.write_table(CollectPaths(job).rollouts, "rollouts", rows.slice(1))
    stats = convert_round(cfg_for([job], tmp_path / "out"), progress=False)
    assert stats["turns"]["orphans"] > 0 and stats["jobs"][0]["orphan_rollouts"] == ["r00000"]
    assert stats["rollouts"]["read"] == 15


def test_abandoned_turns_are_skipped_and_counted(jobs, tmp_path):
    job = copy_job(jobs, tmp_path)
    base = convert_round(cfg_for([job], tmp_path / "base"), progress=False)
    marked = 0
    for f in schema.shard_files(CollectPaths(job).turns):
        t = schema.read_table(f, "turns")
        status = ["abandoned" if turn == 1 else s for turn, s in zip(t["turn"].to_pylist(), t["status"].to_pylist())]
        marked += status.count("abandoned")
        t = t.set_column(t.schema.get_field_index("status"), "status", pa.array(status, pa.string()))
        schema.write_table(f, "turns", t)
    stats = convert_round(cfg_for([job], tmp_path / "out"), progress=False)
    assert marked > 0 and stats["turns"]["abandoned"] == marked and base["turns"]["abandoned"] == 0
    assert stats["turns"]["error"] == base["turns"]["error"]  # not counted as upstream failures
    # the agent never saw those answers: none of them is trained on
    assert stats["turns"]["used_calls"] + stats["turns"]["duplicates_dropped"] == \
        base["turns"]["used_calls"] + base["turns"]["duplicates_dropped"] - marked
    assert all(1 not in turns for r in read_index(tmp_path / "out").rollouts for turns in r["row_turns"])


def test_answers_that_repeat_the_previous_one_are_counted(jobs, tmp_path):
    """An agent stuck re-sending its last action: a rollout's last answer made its previous one,
    token for token (log-probs with it), is counted in stats.json and the summary."""
    job = copy_job(jobs, tmp_path)
    base = convert_round(cfg_for([job], tmp_path / "base"), progress=False)
    shard = schema.shard_files(CollectPaths(job).turns)[0]
    t = schema.read_table(shard, "turns").to_pylist()
    by_rollout: dict[str, list[int]] = {}
    for i, r in enumerate(t):
        by_rollout.setdefault(r["rollout_id"], []).append(i)
    rows = sorted(next(v for v in by_rollout.values() if len(v) >= 2), key=lambda i: t[i]["turn"])
    last, prev = t[rows[-1]], t[rows[-2]]
    last["completion_token_ids"], last["completion_logprobs"] = prev["completion_token_ids"], prev["completion_logprobs"]
    schema.write_table(shard, "turns", t)
    stats = convert_round(cfg_for([job], tmp_path / "out"), progress=False)
    assert stats["turns"]["repeated_answers"] == base["turns"]["repeated_answers"] + 1
    assert f"{stats['turns']['repeated_answers']} of {stats['turns']['used_calls']} answers repeat" in \
        summary(stats, tmp_path / "out")


@pytest.mark.parametrize("mode", ["mask", "keep"])
def test_answers_cut_at_max_tokens_are_counted(jobs, tmp_path, mode):
    """One more answer marked as cut at max_tokens is counted whether convert masks or trains it."""
    job = copy_job(jobs, tmp_path)
    cfg = lambda out: cfg_for([job], tmp_path / out, f"convert.length_completions={mode}")
    base = convert_round(cfg("base"), progress=False)
    shard = schema.shard_files(CollectPaths(job).turns)[0]
    t = schema.read_table(shard, "turns").to_pylist()
    i = next(i for i, r in enumerate(t) if r["status"] == "ok" and r["finish_reason"] != "length")
    t[i]["finish_reason"] = "length"
    schema.write_table(shard, "turns", t)
    stats = convert_round(cfg("out"), progress=False)
    assert stats["turns"]["cut_answers"] == base["turns"]["cut_answers"] + 1
    assert stats["rows"]["length_completions_masked"] == base["rows"]["length_completions_masked"] + (mode == "mask")
    assert f"{stats['turns']['cut_answers']} ran to max_tokens" in summary(stats, tmp_path / "out")


def _mismatch(job: Path) -> Path:
    """Drop one log-prob of rollout r00003's first call."""
    shard = schema.shard_files(CollectPaths(job).turns)[0]
    t = schema.read_table(shard, "turns").to_pylist()
    i = next(i for i, r in enumerate(t) if r["rollout_id"] == "r00003")
    t[i]["completion_logprobs"] = t[i]["completion_logprobs"][:-1]
    schema.write_table(shard, "turns", t)
    return shard


def _greedy(job: Path) -> Path:
    """Rollout r00003's first call was sampled greedily (temperature 0)."""
    shard = schema.shard_files(CollectPaths(job).turns)[0]
    t = schema.read_table(shard, "turns").to_pylist()
    i = next(i for i, r in enumerate(t) if r["rollout_id"] == "r00003")
    t[i]["sampling"] = json.dumps({**json.loads(t[i]["sampling"]), "temperature": 0})
    schema.write_table(shard, "turns", t)
    return shard


def _truncate(job: Path) -> Path:
    shard = schema.shard_files(CollectPaths(job).turns)[1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    return shard


def _foreign_table(job: Path) -> Path:
    bad = CollectPaths(job).turns / "part-zzz.parquet"
    shutil.copy(CollectPaths(job).rollouts, bad)
    return bad


def _foreign_schema(job: Path) -> Path:
    bad = CollectPaths(job).turns / "part-zzz.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), bad)
    return bad


@pytest.mark.parametrize("spoil, reason, rollout", [
    (_mismatch, "completion ids but .* log-probs", "r00003"),
    (_greedy, "temperature 0.0 \\(greedy\\).*sampling.temperature > 0", "r00003"),
    (_truncate, "not a readable parquet file|corrupt parquet", None),
    (_foreign_table, "holds a 'rollouts' table, expected 'turns'", None),
    (_foreign_schema, "no schema_version/table metadata", None),
])
def test_bad_input_is_refused_by_name_and_nothing_is_written(jobs, tmp_path, spoil, reason, rollout):
    job = copy_job(jobs, tmp_path)
    bad = spoil(job)
    out = tmp_path / "out"
    out.mkdir()
    (out / "index.json").write_text("{}")  # an earlier convert's output stays as it was
    with pytest.raises(ConvertInputError, match=reason) as e:
        convert_round(cfg_for([job], out), progress=False)
    assert str(bad) in str(e.value) and (rollout is None or f"rollout {rollout}" in str(e.value))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []
    assert (out / "index.json").read_text() == "{}" and len(list(out.iterdir())) == 1
    stats = convert_round(cfg_for([job], out, "convert.skip_bad=true"), progress=False)
    (skipped,) = stats["skipped"]
    assert skipped["file"] == str(bad) and skipped["rollout_id"] == rollout
    if rollout:
        assert stats["rollouts"]["left_out"]["bad_input"] == 1
        assert rollout not in {r["rollout_id"] for r in read_index(out).rollouts}


def test_missing_rollouts_table(jobs, tmp_path):
    job = copy_job(jobs, tmp_path)
    CollectPaths(job).rollouts.unlink()
    with pytest.raises(ConvertInputError, match="rollouts.parquet: no rollouts table"):
        convert_round(cfg_for([job], tmp_path / "out", "convert.skip_bad=true"), progress=False)
    assert not (tmp_path / "out").exists()


def _main(argv: list[str], capsys) -> tuple[int, str, str]:
    """`python -m wharf.convert ARGV` in this process: (exit status, stdout, stderr)."""
    from wharf.convert.cli import main

    try:
        rc = main(argv, "python -m wharf.convert")
    except SystemExit as e:  # a bad config exits 2 from the parser
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli(jobs, tmp_path, capsys):
    # The refusals in this process (a child process each cost ~20 s of imports on a busy machine),
    # the good run as the real `python -m wharf.convert`.
    rc, _, err = _main(["convert.advantge=rloo"], capsys)
    assert rc == 2 and "did you mean 'advantage'" in err
    rc, _, err = _main(["convert.advantage=ppo"], capsys)
    # a choice outside the schema is refused when the config loads, as a bad config (exit 2)
    assert rc == 2 and "convert.advantage: 'ppo' is not one of grpo, dr_grpo, rloo, zero" in err
    missing = tmp_path / "nowhere"
    rc, _, err = _main([f"convert.jobs=[{missing}]", f"convert.out_dir={tmp_path / 'out2'}"], capsys)
    assert rc == 1 and f"{missing}/rollouts.parquet" in err and "nothing written" in err
    out = subprocess.run([sys.executable, "-m", "wharf.convert", f"convert.jobs=[{jobs / 'job1'}]",
                          f"convert.out_dir={tmp_path / 'out'}"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "rollouts  read 16" in out.stdout and (tmp_path / "out/index.json").exists()


def test_a_rollout_missing_recorded_calls_is_left_out(jobs, tmp_path):
    job = copy_job(jobs, tmp_path)
    shard = next(f for f in schema.shard_files(CollectPaths(job).turns)
                 if "r00005" in schema.read_table(f, "turns")["rollout_id"].to_pylist())
    t = [r for r in schema.read_table(shard, "turns").to_pylist() if not (r["rollout_id"] == "r00005" and r["turn"] == 1)]
    schema.write_table(shard, "turns", t)
    stats = convert_round(cfg_for([job], tmp_path / "out"), progress=False)
    assert stats["jobs"][0]["left_out"]["missing_turns"] == 1
    assert "r00005" not in {r["rollout_id"] for r in read_index(tmp_path / "out").rollouts}


def test_a_job_without_signal_writes_an_empty_index(jobs, tmp_path):
    job = copy_job(jobs, tmp_path)
    rows = schema.read_table(CollectPaths(job).rollouts, "rollouts").to_pylist()
    schema.write_table(CollectPaths(job).rollouts, "rollouts", [{**r, "reward": 1.0} for r in rows])
    stats = convert_round(cfg_for([job], tmp_path / "out"), progress=False)
    index = read_index(tmp_path / "out")
    assert index.files == [] and index.loss_tokens == 0 and stats["rows"]["count"] == 0
    assert stats["groups"] == {"used": 0, "dropped": {"all_equal": 2}}
    assert stats["rollouts"]["left_out"] == {"group_all_equal": 16}
