"""The storage edges of wharf/core/storage.py against a real S3 server (SeaweedFS), each with the
fault that shows it: keys with `#` and `?`, a mirror from before stamps, a shard whose upload
landed but whose check failed, a bucket whose ETags are not MD5s (SSE-KMS / SSE-C), an upload cut
short by an exception, a failed part of a multipart upload."""
from __future__ import annotations

import pytest

from wharf.core import storage


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
