"""The storage edges of wharf/core/storage.py against a real S3 server (SeaweedFS), each with the
fault that shows it: keys with `#` and `?`, a mirror from before stamps, a shard whose upload
landed but whose check failed, a bucket whose ETags are not MD5s (SSE-KMS / SSE-C), an upload cut
short by an exception, a failed part of a multipart upload."""
from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path

import pytest

from testing.s3_faults import sse_etag
from wharf.collect.proxy.shards import TurnStore, write_shard
from wharf.collect.records import TurnRow
from wharf.core import schema, storage, uploads


def test_keys_with_hash_and_question_mark_are_their_own_objects(s3, monkeypatch, tmp_path):
    d = storage.local_path(f"{s3}/run#1")
    d.mkdir(parents=True)
    (d / "a#b?c=1.json").write_bytes(b"hash and query")
    (d / "a").write_bytes(b"plain a")
    assert storage.push(d) == 2
    assert set(storage.listing(f"{s3}/run#1")) == {"a#b?c=1.json", "a"}
    assert storage.get(f"{s3}/run#1/a#b?c=1.json") == b"hash and query"
    assert storage.get(f"{s3}/run#1/a") == b"plain a"
    assert storage.listing(f"{s3}/run") == {}
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "other-node"))
    d2 = storage.local_path(f"{s3}/run#1")
    assert storage.pull(d2) == 2 and (d2 / "a#b?c=1.json").read_bytes() == b"hash and query"


def test_a_mirror_from_before_stamps_is_refused_not_pushed_into_an_empty_bucket(s3, monkeypatch, tmp_path):
    """Its files carry no stamp, so they would pass for this machine's new work: the whole mirror
    is refused, naming what to delete, and the bucket stays empty."""
    old = tmp_path / "old-mirror"
    bucket, prefix = s3.removeprefix("s3://").split("/", 1)
    run = old / "s3" / bucket / prefix / "run"
    (run / "rounds" / "0").mkdir(parents=True)
    (run / "rounds" / "0" / "rollouts.parquet").write_bytes(b"rows of a deleted run")
    monkeypatch.setenv("WHARF_MIRROR", str(old))
    with pytest.raises(storage.StorageError, match=rf"^{old / 's3' / bucket}: a mirror of s3://{bucket} filled before "
                                                   rf"wharf stamped its files.*delete {old / 's3' / bucket}"):
        storage.push(run)
    with pytest.raises(storage.StorageError, match="filled before wharf stamped"):
        storage.local_path(f"{s3}/run")
    assert storage.listing(s3) == {}
    # A mirror of this era (it keeps stamps) is trusted, and so is a new one once marked.
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "new-mirror"))
    d = storage.local_path(f"{s3}/run")
    d.mkdir(parents=True)
    (d / "mine.json").write_bytes(b"{}")
    assert storage.push(d) == 1


def _push_big_and_small(monkeypatch, d: Path, big_mib: int = 6) -> bytes:
    """A small file (one PUT) and one of `big_mib` MiB (a multipart upload of 5 MiB parts)."""
    monkeypatch.setattr(storage, "CHUNK", 1 << 20)
    d.mkdir(parents=True, exist_ok=True)
    data = os.urandom(big_mib << 20)
    (d / "optimizer.pt").write_bytes(data)
    (d / "result.json").write_bytes(b'{"ok": true}')
    return data


def test_a_bucket_whose_etags_are_not_md5s_takes_each_upload_once(s3_faults, monkeypatch, tmp_path):
    """SSE-KMS / SSE-C: the ETag of a PUT is no MD5. Each upload is checked by Content-MD5 as it
    lands and by its own answer's ETag after, so nothing fails its check and nothing is sent twice."""
    s3, proxy = s3_faults
    proxy.etags = sse_etag
    d = storage.local_path(f"{s3}/train")
    data = _push_big_and_small(monkeypatch, d)
    assert storage.push(d) == 2
    puts = [p for m, p in proxy.seen if m == "PUT" and "result.json" in p]
    assert len(puts) == 1, puts
    assert storage.head(f"{s3}/train/result.json").etag == sse_etag(hashlib.md5(b'{"ok": true}').hexdigest())
    assert storage.push(d) == 0  # the stamps know the objects by their SSE ETags
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "other-node"))
    d2 = storage.local_path(f"{s3}/train")
    assert storage.pull(d2) == 2 and (d2 / "optimizer.pt").read_bytes() == data
    assert storage.pull(d2) == 0


def _open_uploads(s3_server, monkeypatch, prefix: str) -> list:
    """The multipart uploads SeaweedFS holds open under `prefix`, asked of it directly."""
    bucket, env = s3_server
    with monkeypatch.context() as m:
        for k, v in env.items():
            m.setenv(k, v)
        client = uploads.s3_client()
        return client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])


def test_a_failed_part_aborts_its_multipart_upload(s3_faults, s3_server, monkeypatch):
    s3, proxy = s3_faults
    d = storage.local_path(f"{s3}/train")
    _push_big_and_small(monkeypatch, d, big_mib=11)
    proxy.fail = lambda method, path: method == "PUT" and "partNumber=2" in path
    with pytest.raises(storage.StorageError, match=rf"{s3}/train/optimizer.pt: cannot write"):
        storage.push(d)
    assert proxy.failed  # the fault was met
    prefix = s3.split("/", 3)[3]
    assert _open_uploads(s3_server, monkeypatch, prefix) == []
    assert "optimizer.pt" not in storage.listing(f"{s3}/train")
    proxy.fail = None
    assert storage.push(d) == 1 and storage.listing(f"{s3}/train")["optimizer.pt"].size == 11 << 20


def test_a_file_cut_short_during_its_upload_commits_nothing(s3_faults, s3_server, monkeypatch):
    """The file is truncated in place once its first part has gone up: the upload fails, no
    truncated object appears, and no multipart upload stays open."""
    s3, proxy = s3_faults
    d = storage.local_path(f"{s3}/train")
    _push_big_and_small(monkeypatch, d, big_mib=11)

    def truncate_after_part_1(method, path):
        if method == "PUT" and "partNumber=1" in path:
            os.truncate(d / "optimizer.pt", 7 << 20)
        return False

    proxy.fail = truncate_after_part_1
    with pytest.raises(storage.StorageError, match=r"optimizer.pt: shorter than when its upload began"):
        storage.push(d)
    assert "optimizer.pt" not in storage.listing(f"{s3}/train")
    assert _open_uploads(s3_server, monkeypatch, s3.split("/", 3)[3]) == []


def _turn(i: int) -> dict:
    now = time.time()
    return TurnRow(rollout_id="r", turn=i, request_id=f"q{i}", api="chat", policy="m", started_at=now, ended_at=now,
                   request="{}", response="{}", sampling="{}", prompt_token_ids=[1, 2], completion_token_ids=[3],
                   completion_logprobs=[-0.5]).as_dict()


def _bucket_request_ids(s3: str, tmp_path: Path) -> list[str]:
    """Every row's request_id over every shard the bucket holds, read on another machine."""
    reader = tmp_path / "reader"
    reader.mkdir(exist_ok=True)
    ids = []
    for key in storage.listing(f"{s3}/turns"):
        (reader / key).write_bytes(storage.get(f"{s3}/turns/{key}"))
        ids += schema.read_table(reader / key, "turns").column("request_id").to_pylist()
    return sorted(ids)


def test_a_shard_that_landed_but_failed_its_check_is_not_published_twice(s3_faults, tmp_path):
    """The PUT lands, the HEAD that checks it answers 503: the rows stay pending, and their retry
    overwrites the landed shard instead of adding a second one with the same rows."""
    s3, proxy = s3_faults
    turns = storage.local_path(f"{s3}/turns")

    async def scenario():
        store = TurnStore(turns, turns / "_wal", shard_rows=1000, shard_bytes=1 << 30, shard_seconds=0, fsync=False)
        store.recover()
        await store.durable(store.add(_turn(0)))
        proxy.fail = lambda method, path: method == "HEAD" and "/turns/part-" in path
        with pytest.raises(storage.StorageError):
            await store.flush()
        proxy.fail = None
        assert [k for k in storage.listing(f"{s3}/turns")]  # it landed
        await store.durable(store.add(_turn(1)))
        assert len(await store.flush()) == 1
        await store.close()

    asyncio.run(scenario())
    assert proxy.failed
    assert len(storage.listing(f"{s3}/turns")) == 1
    assert _bucket_request_ids(s3, tmp_path) == ["q0", "q1"]


def test_the_fold_keeps_one_row_per_request_id(tmp_path):
    """A landed shard whose rows a crash then recovered from the WAL into a shard of another name:
    the round's fold holds each request once."""
    write_shard(tmp_path / "part-a.parquet", [_turn(0), _turn(1)])
    write_shard(tmp_path / "part-b.parquet", [_turn(1), _turn(2)])
    schema.compact_dir(tmp_path, "turns")
    assert sorted(schema.read_dir(tmp_path, "turns").column("request_id").to_pylist()) == ["q0", "q1", "q2"]
