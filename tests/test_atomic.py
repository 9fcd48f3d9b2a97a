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


def test_write_with_takes_writers_that_want_a_path_and_mode_holds_from_the_first_byte(tmp_path):
    """A writer that raises (a full disk under pyarrow or torch.save) leaves the old file and no
    temp; a private file (credentials) is 0600 while its temp is still being written."""
    path = tmp_path / "table.bin"
    atomic.write_with(path, lambda tmp: tmp.write_bytes(b"old"))

    def half(tmp):
        tmp.write_bytes(b"ne")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        atomic.write_with(path, half)
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["table.bin"]

    modes = []
    secret = tmp_path / "token"
    atomic.write_with(secret, lambda tmp: (modes.append(stat.S_IMODE(tmp.stat().st_mode)), tmp.write_bytes(b"s")),
                      mode=0o600)
    atomic.write_bytes(secret, b"t", mode=0o600)
    assert modes == [0o600] and stat.S_IMODE(secret.stat().st_mode) == 0o600 and secret.read_bytes() == b"t"
