"""Markers against a failing bucket (a real S3 server behind testing/s3_faults.py, which answers
503 on demand): a rewrite withdraws its marker first, so no reader ever sees an index.json naming
new or missing files, even when the push is cut short; convert refuses a round still collecting."""
from __future__ import annotations

import json

import pytest

from wharf.convert.reader import ConvertInputError, read_job
from wharf.core import storage
from wharf.core.layout import CollectPaths


def _write(d, files: dict[str, bytes]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (d / name).write_bytes(data)


def test_a_reconvert_cut_short_leaves_no_marker_naming_new_or_missing_files(s3_faults, monkeypatch, tmp_path):
    s3, proxy = s3_faults
    d = storage.local_path(f"{s3}/convert")
    _write(d, {"mb-0.bin": b"v1 batch 0", "mb-1.bin": b"v1 batch 1", "index.json": b'["mb-0.bin", "mb-1.bin"]'})
    assert storage.push(d, last=("index.json",), delete_stale=True) == 3
    reader = tmp_path / "reader"  # another machine that pulled the first convert
    monkeypatch.setenv("WHARF_MIRROR", str(reader))
    assert storage.pull(storage.local_path(f"{s3}/convert")) == 3
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "mirror"))

    (d / "mb-1.bin").unlink()  # the re-convert: mb-0 rewritten, mb-1 gone, mb-2 new
    _write(d, {"mb-0.bin": b"v2 batch 0", "mb-2.bin": b"v2 batch 2", "index.json": b'["mb-0.bin", "mb-2.bin"]'})
    proxy.fail = lambda method, path: method == "PUT" and "mb-2" in path
    with pytest.raises(storage.StorageError, match="mb-2.bin: cannot write"):
        storage.push(d, last=("index.json",), delete_stale=True)
    assert proxy.failed and "index.json" not in storage.listing(f"{s3}/convert")  # withdrawn, not left stale

    monkeypatch.setenv("WHARF_MIRROR", str(reader))  # the reader sees "not converted", not v1's index
    storage.pull(storage.local_path(f"{s3}/convert"))
    assert not (storage.local_path(f"{s3}/convert") / "index.json").exists()

    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "mirror"))
    proxy.fail = None  # the bucket is back: the next push completes the rewrite, marker last
    storage.push(d, last=("index.json",), delete_stale=True)
    got = storage.listing(f"{s3}/convert")
    assert set(got) == {"mb-0.bin", "mb-2.bin", "index.json"}
    assert storage.get(f"{s3}/convert/index.json") == b'["mb-0.bin", "mb-2.bin"]'


def test_convert_refuses_a_round_still_collecting(tmp_path):
    paths = CollectPaths(tmp_path / "collect")
    paths.root.mkdir()
    paths.manifest.write_text(json.dumps({"job_id": "j", "state": "running"}))
    with pytest.raises(ConvertInputError, match=r"manifest.json: state is 'running': collect has not finished"):
        read_job(paths.root)
