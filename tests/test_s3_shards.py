"""The proxy's shard store with its shards in object storage (a real S3 server, SeaweedFS): a
shard is published only once it is in the bucket; an upload that fails keeps its rows pending
and its WAL segment, and the next flush publishes them; a shard a crash kept from the bucket is
uploaded at start-up. The WAL never leaves the local disk."""
from __future__ import annotations

import asyncio
import os
import time

import pytest

from wharf.collect.proxy.shards import TurnStore, shard_name, write_shard
from wharf.collect.records import TurnRow
from wharf.core import schema, storage


def _row(i: int) -> dict:
    now = time.time()
    return TurnRow(rollout_id="r", turn=i, request_id=f"q{i}", api="chat", policy="m", started_at=now, ended_at=now,
                   request="{}", response="{}", sampling="{}", prompt_token_ids=[1, 2], completion_token_ids=[3],
                   completion_logprobs=[-0.5]).as_dict()


def _store(turns) -> TurnStore:
    return TurnStore(turns, turns / "_wal", shard_rows=1000, shard_bytes=1 << 30, shard_seconds=0, fsync=False)


def test_a_failed_upload_keeps_the_rows_and_the_next_flush_publishes_them(s3, monkeypatch):
    turns = storage.local_path(f"{s3}/turns")
    good_secret = os.environ["AWS_SECRET_ACCESS_KEY"]

    async def scenario():
        store = _store(turns)
        store.recover()
        await store.durable(store.add(_row(0)))
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        with pytest.raises(storage.StorageError, match="access refused"):
            await store.flush()
        assert [r["request_id"] for r in store.pending] == ["q0"]
        assert list(turns.glob("part-*.parquet")) == []  # no shard that the bucket lacks
        assert list((turns / "_wal").glob("seg-*.jsonl"))  # the row is still in the WAL
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", good_secret)
        await store.durable(store.add(_row(1)))
        assert len(await store.flush()) == 1
        await store.close()

    asyncio.run(scenario())
    objects = storage.listing(f"{s3}/turns")
    assert len(objects) == 1 and next(iter(objects)).startswith("part-")  # one shard, no WAL
    local = next(turns.glob("part-*.parquet"))
    assert storage.get(f"{s3}/turns/{local.name}") == local.read_bytes()
    assert [r["request_id"] for r in schema.read_table(local, "turns").to_pylist()] == ["q0", "q1"]


def test_a_shard_a_crash_kept_from_the_bucket_is_uploaded_at_start_up(s3):
    turns = storage.local_path(f"{s3}/turns")
    turns.mkdir(parents=True)
    written = write_shard(turns / shard_name(), [_row(0)])  # written, then the process died before its upload
    assert storage.listing(f"{s3}/turns") == {}
    store = _store(turns)
    store.recover()
    asyncio.run(store.close())
    assert set(storage.listing(f"{s3}/turns")) == {written.name}
