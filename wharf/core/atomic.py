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


def fsync_dir(directory: str | Path) -> None:
    """Make a file's creation, rename or removal in `directory` durable (a file's fsync covers only its data)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: str | Path, data: bytes, *, durable: bool = False) -> Path:
    """Replace `path` with `data` atomically (its parent dir made if missing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if durable:
        fsync_dir(path.parent)
    return path


def write_text(path: str | Path, text: str, *, durable: bool = False) -> Path:
    return write_bytes(path, text.encode("utf-8"), durable=durable)


def write_json(path: str | Path, data, *, indent: int = 1, durable: bool = False, **dumps) -> Path:
    """`data` as JSON (json.dumps's keyword arguments pass through: default=, allow_nan=), a newline at the end."""
    return write_text(path, json.dumps(data, indent=indent, **dumps) + "\n", durable=durable)
