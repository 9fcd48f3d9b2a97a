"""A bucket that fails while rollouts close (a real S3 server behind testing/s3_faults.py
answering 503): the finished, scored rollout is kept, its turns stay in the proxy's WAL and go up
with the next flush, and the rollouts table stays on disk until its upload succeeds."""
from __future__ import annotations

import time

from wharf.collect.proxy.background import BackgroundProxy
from wharf.collect.records import RolloutRow
from wharf.collect.runner import save_rollouts
from wharf.core import schema, storage
from wharf.core.layout import CollectPaths

from proxy_util import close_rollout, make_cfg, open_rollout, post


def _call(info) -> None:
    r = post(f"{info['base_url']}/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200, r.text


def _shard_rollouts(url: str) -> set[str]:
    d = storage.local_path(url)
    storage.pull(d, ("part-*.parquet",))
    return {r["rollout_id"] for f in schema.shard_files(d) for r in schema.read_table(f, "turns").to_pylist()}


def _rows(n: int) -> list[RolloutRow]:
    now = time.time()
    return [RolloutRow(rollout_id=f"r{i}", job_id="j", round=0, task_id="t", group_id="g", attempt=i, policy="p",
                       reward=1.0, rewards="{}", status="ok", n_turns=1, n_errors=0, started_at=now, ended_at=now,
                       trial_dir=f"harbor/r{i}", error=None) for i in range(n)]


def test_a_close_whose_upload_fails_keeps_the_rollout_and_the_next_flush_publishes_it(s3_faults, stub, tmp_path):
    s3, faults = s3_faults
    turns = storage.local_path(f"{s3}/collect/turns")
    cfg = make_cfg(tmp_path, stub.url, f"proxy.out_dir={turns}", f"proxy.wal_dir={tmp_path}/wal")
    with BackgroundProxy(cfg) as p:
        a = open_rollout(p, "a")
        _call(a)
        faults.fail = lambda method, path: method == "PUT"
        closed = close_rollout(p, "a")
        assert closed["n_turns"] == 1  # was a 500: the trial became infra_error, its reward lost
        assert closed["published"] is False  # its rows only in the WAL: a Ray node does not count the trial done
        assert faults.failed and storage.listing(f"{s3}/collect/turns") == {}
        faults.fail = None
        b = open_rollout(p, "b")
        _call(b)
        assert close_rollout(p, "b")["published"] is True  # with a's rows, at b's close
    assert _shard_rollouts(f"{s3}/collect/turns") == {"a", "b"}


def test_finished_rows_stay_on_disk_until_the_bucket_takes_them(s3_faults):
    s3, faults = s3_faults
    paths = CollectPaths(storage.local_path(f"{s3}/collect"))
    paths.root.mkdir(parents=True)
    rows = _rows(2)
    faults.fail = lambda method, path: method == "PUT"
    assert save_rollouts(paths, rows[:1]) is False
    assert [r["rollout_id"] for r in schema.read_table(paths.rollouts, "rollouts").to_pylist()] == ["r0"]
    faults.fail = None
    assert save_rollouts(paths, rows) is True
    storage.pull(paths.root)  # the bucket holds what the disk holds: the mirror is kept as it is
    got = storage.get(f"{s3}/collect/rollouts.parquet")
    assert got == paths.rollouts.read_bytes()
    assert [r["rollout_id"] for r in schema.read_table(paths.rollouts, "rollouts").to_pylist()] == ["r0", "r1"]


def test_rows_are_written_off_the_dispatch_loop_newest_first_and_all_at_the_end(s3_faults):
    """With a slow bucket (0.2 s a request) recording a finished trial returns at once; rows that
    finish during a write go out together in the next; drain leaves every row on disk and in the bucket."""
    from wharf.collect.runner import RowsWriter

    s3, faults = s3_faults
    paths = CollectPaths(storage.local_path(f"{s3}/collect"))
    paths.root.mkdir(parents=True)
    rows = _rows(10)
    faults.delay_s = 0.2
    writer = RowsWriter(paths)
    t0 = time.monotonic()
    for i in range(1, len(rows) + 1):
        writer.submit(rows[:i])
    assert time.monotonic() - t0 < 0.2  # no submit waited for a write
    writer.drain(rows)
    assert writer.writes < len(rows)  # coalesced
    got = schema.read_table(paths.rollouts, "rollouts").to_pylist()
    assert [r["rollout_id"] for r in got] == [f"r{i}" for i in range(10)]
    assert storage.get(f"{s3}/collect/rollouts.parquet") == paths.rollouts.read_bytes()
