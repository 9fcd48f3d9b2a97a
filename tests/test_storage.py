"""wharf/core/storage.py against a real S3 server (SeaweedFS on 127.0.0.1: the `s3` fixture)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from wharf.core import schema, storage
from wharf.core.layout import RunLayout


def test_local_paths_are_used_as_they_are(tmp_path):
    d = tmp_path / "runs"
    (d / "x").mkdir(parents=True)
    (d / "x" / "f").write_text("1")
    assert storage.local_path(str(d)) == d and storage.local_path(d) == d
    assert storage.url_of(d) is None and not storage.is_remote(str(d))
    assert storage.pull(d) == 0 and storage.push(d) == 0 and storage.push_file(d / "x" / "f") is False
    assert RunLayout.of(str(d), "r").root == d / "r"


def test_a_url_maps_to_its_mirror_and_back(monkeypatch, tmp_path):
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "m"))
    local = storage.local_path("s3://bucket/runs/a")
    assert local == tmp_path / "m" / "s3" / "bucket" / "runs" / "a"
    assert storage.url_of(local / "rounds" / "0") == "s3://bucket/runs/a/rounds/0"
    assert RunLayout.of("s3://bucket/runs", "a").round(0).collect.root == local / "rounds" / "0" / "collect"
    with pytest.raises(storage.StorageError, match="needs a bucket"):
        storage.local_path("s3:///nobucket")


def test_put_list_get(s3):
    storage.put(f"{s3}/a/one.bin", b"1" * 10)
    storage.put(f"{s3}/a/b/two.bin", b"22")
    assert {k: e.size for k, e in storage.listing(f"{s3}/a").items()} == {"one.bin": 10, "b/two.bin": 2}
    assert storage.get(f"{s3}/a/b/two.bin") == b"22"
    assert storage.listing(f"{s3}/nothing-here") == {}


def test_an_object_is_listed_only_once_whole(s3):
    """A multipart upload in progress is not an object: readers never see half of it."""
    r = storage.remote(f"{s3}/big.bin")
    data = os.urandom(12 << 20)  # more than one 5 MiB part
    stream = r.fs.open_output_stream(r.path)
    stream.write(data[: 11 << 20])
    stream.flush()
    assert "big.bin" not in storage.listing(s3)
    stream.write(data[11 << 20:])
    stream.close()
    assert storage.listing(s3)["big.bin"].size == len(data)
    assert storage.get(f"{s3}/big.bin") == data


def test_push_uploads_the_marker_last_and_only_what_changed(s3):
    d = storage.local_path(f"{s3}/convert")
    (d / "sub").mkdir(parents=True)
    for name in ("mb-0.bin", "mb-1.bin", "sub/x.bin", "index.json"):
        (d / name).write_bytes(name.encode())
    (d / ".tmp-half").write_bytes(b"never")
    (d / "_wal").mkdir()
    (d / "_wal" / "seg").write_bytes(b"local only")
    assert storage.push(d, last=("index.json",), exclude=("_wal/*",)) == 4
    got = storage.listing(f"{s3}/convert")
    assert set(got) == {"mb-0.bin", "mb-1.bin", "sub/x.bin", "index.json"}
    assert got["index.json"].mtime_ns >= max(e.mtime_ns for e in got.values())
    assert storage.push(d, last=("index.json",), exclude=("_wal/*",)) == 0  # nothing changed
    (d / "mb-1.bin").unlink()
    (d / "index.json").write_bytes(b"index v2")
    assert storage.push(d, last=("index.json",), exclude=("_wal/*",), delete_stale=True) == 1
    assert set(storage.listing(f"{s3}/convert")) == {"mb-0.bin", "sub/x.bin", "index.json"}
    assert storage.get(f"{s3}/convert/index.json") == b"index v2"


def test_pull_fetches_what_it_lacks(s3, monkeypatch, tmp_path):
    for name in ("manifest.json", "rollouts.parquet", "turns/part-1.parquet", "harbor/t/log.txt"):
        storage.put(f"{s3}/job/{name}", name.encode())
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "other-node"))
    d = storage.local_path(f"{s3}/job")
    assert storage.pull(d, ("manifest.json", "rollouts.parquet", "turns/part-*.parquet")) == 3
    assert (d / "turns" / "part-1.parquet").read_bytes() == b"turns/part-1.parquet"
    assert not (d / "harbor").exists()
    assert storage.pull(d, ("*",)) == 1  # only the one it lacked
    assert storage.pull(d) == 0
    (d / "rollouts.parquet").write_bytes(b"written here since")  # a resumed stage's own newer file
    assert storage.pull(d) == 0 and (d / "rollouts.parquet").read_bytes() == b"written here since"


def test_a_missing_bucket_is_named(s3):
    bucket_url = "s3://no-such-bucket-wharf/runs"
    with pytest.raises(storage.StorageError, match=r"s3://no-such-bucket-wharf/runs: .*bucket does not exist"):
        storage.listing(bucket_url)
    with pytest.raises(storage.StorageError, match="bucket does not exist"):
        storage.pull(storage.local_path(bucket_url))


def test_bad_credentials_are_named(s3, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(storage.StorageError, match=rf"{s3}/x: cannot write: access refused: check AWS_ACCESS_KEY_ID"):
        storage.put(f"{s3}/x", b"1")


def test_no_server_is_named(s3, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    with pytest.raises(storage.StorageError, match="check AWS_ENDPOINT_URL"):
        storage.listing(s3)


def test_a_foreign_object_is_refused_naming_its_url(s3):
    storage.put(f"{s3}/job/rollouts.parquet", b"PAR1 but not parquet")
    d = storage.local_path(f"{s3}/job")
    storage.pull(d)
    with pytest.raises(schema.SchemaError, match=rf"^{s3}/job/rollouts.parquet: not a readable parquet file"):
        with storage.urls_in_errors():
            schema.read_table(d / "rollouts.parquet", "rollouts")
    with pytest.raises(storage.StorageError, match=rf"{s3}/job/gone: cannot read: no such object"):
        storage.get(f"{s3}/job/gone")


def test_filesystems_pyarrow_opens_other_than_s3(tmp_path, monkeypatch):
    """Any scheme pyarrow or fsspec opens (here fsspec's in-memory file system) mirrors the same way."""
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "m"))
    d = storage.local_path("memory://bucket/run")
    d.mkdir(parents=True)
    (d / "a.json").write_text("{}")
    assert storage.push(d) == 1
    assert isinstance(storage.remote("memory://bucket/run").fs, pafs.PyFileSystem)
    assert storage.get("memory://bucket/run/a.json") == b"{}"


def test_the_bucket_is_the_truth_a_deleted_prefix_resumes_nothing(s3):
    """A mirror left by an earlier run of the same URL (its prefix since deleted, or a new empty
    bucket) counts for nothing: pull removes its copies and push never uploads them back."""
    d = storage.local_path(f"{s3}/run")
    (d / "rounds").mkdir(parents=True)
    (d / "rounds" / "rollouts.parquet").write_bytes(b"old rows")
    (d / "manifest.json").write_bytes(b"{}")
    assert storage.push(d) == 2
    r = storage.remote(f"{s3}/run")
    r.fs.delete_dir_contents(r.path)  # by another machine (or: the same URL on a new, empty bucket)
    (d / "mine.txt").write_bytes(b"written here, never uploaded")
    assert storage.pull(d, ("rounds/*",)) == 0
    assert sorted(p.name for p in d.rglob("*") if p.is_file()) == ["manifest.json", "mine.txt"]
    assert storage.push(d) == 1 and set(storage.listing(f"{s3}/run")) == {"mine.txt"}
    assert not (d / "manifest.json").exists()  # a stale copy push found: removed, not uploaded back


def test_pull_checks_size_and_etag_not_whole_second_times(s3, monkeypatch, tmp_path):
    storage.put(f"{s3}/job/rollouts.parquet", b"version-1")
    d = storage.local_path(f"{s3}/job")
    assert storage.pull(d) == 1
    storage.put(f"{s3}/job/rollouts.parquet", b"version-2")  # the same second, the same size
    assert storage.pull(d) == 1 and (d / "rollouts.parquet").read_bytes() == b"version-2"
    assert storage.pull(d) == 0
    (d / "rollouts.parquet").write_bytes(b"newer here")  # this machine's write since: kept...
    assert storage.pull(d) == 0 and (d / "rollouts.parquet").read_bytes() == b"newer here"
    storage.put(f"{s3}/job/rollouts.parquet", b"other machine")  # ...unless the bucket changed meanwhile
    assert storage.pull(d) == 1 and (d / "rollouts.parquet").read_bytes() == b"other machine"
    # A file this mirror never exchanged: kept when it has the object's bytes (MD5 = ETag), else replaced.
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "unstamped"))
    d2 = storage.local_path(f"{s3}/job")
    d2.mkdir(parents=True)
    (d2 / "rollouts.parquet").write_bytes(b"other machine")
    assert storage.pull(d2) == 0
    (d2 / "rollouts.parquet").unlink()
    storage._drop_stamp(f"{s3}/job/rollouts.parquet")
    (d2 / "rollouts.parquet").write_bytes(b"other-machin")
    assert storage.pull(d2) == 1 and (d2 / "rollouts.parquet").read_bytes() == b"other machine"


def test_transfers_stream_a_large_file(s3, monkeypatch, tmp_path):
    """A file several chunks long goes up as a multipart upload and comes down in chunks: the
    Python heap never holds the whole object."""
    import tracemalloc

    monkeypatch.setattr(storage, "CHUNK", 1 << 20)
    d = storage.local_path(f"{s3}/train")
    d.mkdir(parents=True)
    data = os.urandom(24 << 20)
    (d / "optimizer.pt").write_bytes(data)
    tracemalloc.start()
    try:
        assert storage.push(d) == 1
        monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "other-node"))
        d2 = storage.local_path(f"{s3}/train")
        assert storage.pull(d2) == 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    assert (d2 / "optimizer.pt").read_bytes() == data
    assert "-" in storage.head(f"{s3}/train/optimizer.pt").etag  # multipart: its ETag is no MD5
    assert storage.pull(d2) == 0 and storage.push(d2) == 0  # and the stamps still recognise it


def test_a_file_growing_during_its_upload_goes_up_as_read_and_again_next_push(s3, monkeypatch):
    """A log still written to (an endpoint's, beside a round being pushed) is no error."""
    d = storage.local_path(f"{s3}/logs")
    d.mkdir(parents=True)
    log = d / "engine.log"
    log.write_bytes(b"line 1\n")
    real_stat = storage.Path.stat

    def stat_then_grow(self, *a, **kw):  # the writer appends right after the uploader's stat
        st = real_stat(self, *a, **kw)
        if self == log and sys._getframe(1).f_code.co_name == "_upload" and log.read_bytes() == b"line 1\n":
            with open(log, "ab") as f:
                f.write(b"line 2\n")
        return st

    monkeypatch.setattr(storage.Path, "stat", stat_then_grow)
    assert storage.push(d) == 1
    monkeypatch.setattr(storage.Path, "stat", real_stat)
    assert storage.get(f"{s3}/logs/engine.log") == b"line 1\nline 2\n"
    assert storage.push(d) == 1  # its stamp says it changed after the stat: sent again
    assert storage.push(d) == 0
