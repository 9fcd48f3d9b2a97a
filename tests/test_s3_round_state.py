"""A collect round in a real bucket (SeaweedFS) through a push cut short at every step: the round
keeps a readable manifest (so a resume elsewhere keeps its job id and GRPO groups); a round with
rows and no manifest is refused by resume and by `wharf convert` (one line, exit 2); shard folding
deletes only the shards it read."""
from __future__ import annotations

import json
import threading

import pytest

from testing.synthetic_job import make_job
from wharf.collect import runner
from wharf.collect.manifest import load_manifest, write_json
from wharf.core import schema, storage
from wharf.core.layout import JOB_FILES, CollectPaths
from wharf.core.round_state import ManifestMissing

JOB = "bench-0"  # make_job's job id


class Cut(storage.StorageError):
    pass


def _cut_after(monkeypatch, steps: int) -> None:
    """Every upload and delete of the bucket counts as a step; the one after `steps` fails."""
    count, lock = [0], threading.Lock()

    def counted(fn):
        def step(*args):
            with lock:
                count[0] += 1
                if count[0] > steps:
                    raise Cut(f"cut after {steps} steps")
            return fn(*args)
        return step

    monkeypatch.setattr(storage, "_upload", counted(storage._upload))
    monkeypatch.setattr(storage, "delete", counted(storage.delete))


def _round_under_way(url: str) -> CollectPaths:
    """A round as a driver holds it at its end: in the bucket the `running` manifest it pushed at its
    start, some rows and shards; on disk the `done` manifest, all rows, shards and trial logs."""
    paths = CollectPaths(storage.local_path(url))
    make_job(paths.root, 4, shards=2, size=0.05, turns=(2, 3))
    write_json(paths.manifest, {"job_id": JOB, "round": 0, "state": "running"})
    storage.push(paths.root, last=(paths.manifest.name,))
    make_job(paths.root, 8, shards=3, size=0.05, turns=(2, 3))  # more rows and shards since
    for i in range(3):
        (paths.root / f"harbor/trial-{i}").mkdir(parents=True, exist_ok=True)
        (paths.root / f"harbor/trial-{i}/result.json").write_text(json.dumps({"i": i}))
    write_json(paths.manifest, {"job_id": JOB, "round": 0, "state": "done"})
    return paths


def _resumed_elsewhere(url: str, monkeypatch, tmp_path, name: str) -> tuple[dict, str]:
    """What a driver on another machine finds: the manifest, and the job id its resume takes."""
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / name))
    paths = CollectPaths(storage.local_path(url))
    storage.pull(paths.root, JOB_FILES)
    prev = load_manifest(paths)
    return prev, runner.round_job_id(paths, 0, prev, runner._load_done(paths))


def test_a_push_cut_short_at_any_step_leaves_the_round_a_manifest_and_its_job_id(s3, monkeypatch, tmp_path):
    steps, finished = 0, False
    while not finished:
        url = f"{s3}/cut-{steps}/rounds/0/collect"
        monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / f"m{steps}"))
        paths = _round_under_way(url)
        with monkeypatch.context() as m:
            _cut_after(m, steps)
            try:
                runner._push_round(paths)
                finished = True
            except Cut:
                pass
        prev, job_id = _resumed_elsewhere(url, monkeypatch, tmp_path, f"elsewhere{steps}")
        assert prev.get("state") == ("done" if finished else "running"), (steps, prev)
        assert job_id == JOB, steps  # the resume keeps the round's job id, so its groups
        steps += 1
    assert steps > 5  # the push had that many steps to cut


def test_resume_and_convert_refuse_a_round_with_rows_and_no_manifest(s3, monkeypatch, tmp_path, capsys):
    url = f"{s3}/runs/r/rounds/0/collect"
    paths = CollectPaths(storage.local_path(url))
    make_job(paths.root, 4, shards=1, size=0.05, turns=(2, 3))
    storage.push(paths.root)
    with pytest.raises(ManifestMissing, match=r"^round 0: .*rollouts.parquet holds finished rollouts but manifest.json is missing"):
        _resumed_elsewhere(url, monkeypatch, tmp_path, "elsewhere")

    from wharf.convert.cli import main
    rc = main([f"runs_dir={s3}/runs", "name=r"], "wharf convert")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("wharf convert:")]
    assert rc == 2 and len(lines) == 1, lines  # one line (the log above it is the log)
    err = lines[0]
    assert err.startswith("wharf convert: round 0: ") and "collect the round again" in err
    assert f"{s3}/runs/r/rounds/0/collect/rollouts.parquet" in err  # named by its URL
    assert not storage.listing(f"{s3}/runs/r/rounds/0/convert")  # nothing written


def test_folding_shards_deletes_only_the_shards_it_read(s3, monkeypatch):
    url = f"{s3}/fold/rounds/0/collect"
    paths = CollectPaths(storage.local_path(url))
    make_job(paths.root, 6, shards=3, size=0.05, turns=(2, 3))
    storage.push(paths.turns)
    late = "part-late-node-b.parquet"  # a node's shard that lands between the fold's pull and push
    fold = schema.compact_dir

    def landing(directory, name):
        out = fold(directory, name)
        storage.put(f"{url}/turns/{late}", (paths.turns / out.name).read_bytes())
        return out

    monkeypatch.setattr(schema, "compact_dir", landing)
    runner._fold_shards(paths)
    there = storage.listing(f"{url}/turns")
    assert late in there and len(there) == 2, sorted(there)  # the folded shard and the late one
