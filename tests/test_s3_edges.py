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
