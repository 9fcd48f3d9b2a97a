"""wharf.core.atomic: a file is replaced whole or not at all, and nothing is left beside it."""
import json
import os
import stat

import pytest

from wharf.core import atomic


def test_write_json_replaces_the_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "deep" / "dir" / "record.json"
    atomic.write_json(path, {"a": 1})
    atomic.write_json(path, {"a": 2, "when": object()}, default=lambda o: "obj")
    assert json.loads(path.read_text()) == {"a": 2, "when": "obj"}
    assert path.read_text().endswith("\n")
    assert sorted(p.name for p in path.parent.iterdir()) == ["record.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temp(tmp_path, monkeypatch):
    path = tmp_path / "record.json"
    atomic.write_json(path, {"old": True})

    def broken(src, dst):
        assert os.path.exists(src)  # the new bytes were written in full, beside the target
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", broken)
    with pytest.raises(OSError, match="No space"):
        atomic.write_text(path, "new")
    assert json.loads(path.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]
    with pytest.raises(ValueError):  # not JSON at all: raised before any file is touched
        atomic.write_json(path, {"x": float("nan")}, allow_nan=False)
    assert json.loads(path.read_text()) == {"old": True}


def test_durable_syncs_the_data_and_the_directory(tmp_path, monkeypatch):
    synced = []
    real_fsync = atomic.os.fsync

    def fsync(fd):
        st = os.fstat(fd)
        synced.append("dir" if stat.S_ISDIR(st.st_mode) else f"file of {st.st_size} bytes")
        real_fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    atomic.write_bytes(tmp_path / "a", b"x")
    assert synced == []
    atomic.write_bytes(tmp_path / "b", b"yz", durable=True)
    assert synced == ["file of 2 bytes", "dir"]
    assert (tmp_path / "b").read_bytes() == b"yz"
