"""Files replaced whole or not at all: a reader (another process, a resumed run, a person's
`cat`) sees the old file or the new one, never half of one, and a run killed mid-write leaves
the old file and no stray temp beside it.

The temp file lies in the target's own directory (a rename is atomic only within a filesystem)
under a name of its own, so two writers of one path never write into the same temp file.
`durable=True` also fsyncs the data and the directory: the new file then survives a power cut,
not just a killed process (the records a run cannot rebuild: the collect manifest).
"""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Callable


def fsync_dir(directory: str | Path) -> None:
    """Make a file's creation, rename or removal in `directory` durable (a file's fsync covers only its data)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_with(path: str | Path, writer: Callable[[Path], object], *, durable: bool = False, mode: int = 0o666) -> Path:
    """Replace `path` atomically with what `writer(temp_path)` writes there (pyarrow's
    write_table, torch.save: writers that want a path). `mode` before the umask, as open()'s:
    0o600 for a file only its owner may read, from its first byte on."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
        writer(tmp)
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if durable:
        fsync_dir(path.parent)
    return path


def write_bytes(path: str | Path, data: bytes, *, durable: bool = False, mode: int = 0o666) -> Path:
    """Replace `path` with `data` atomically (its parent dir made if missing)."""
    return write_with(path, lambda tmp: tmp.write_bytes(data), durable=durable, mode=mode)


def write_text(path: str | Path, text: str, *, durable: bool = False) -> Path:
    return write_bytes(path, text.encode("utf-8"), durable=durable)


def write_json(path: str | Path, data, *, indent: int = 1, durable: bool = False, **dumps) -> Path:
    """`data` as JSON (json.dumps's keyword arguments pass through: default=, allow_nan=), a newline at the end."""
    return write_text(path, json.dumps(data, indent=indent, **dumps) + "\n", durable=durable)
