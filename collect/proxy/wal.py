"""Write-ahead log: append-only JSON-lines segments, written with os.write before a call is answered.

A record is one line written by one `os.write` on an O_APPEND descriptor: once the call returns,
the bytes are in the kernel's page cache and survive SIGKILL of the process (not a power cut:
set `fsync=True` for that, at a large cost per call). A crash mid-write can leave a torn last
line; that call was never answered, so readers skip it.
"""
from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

log = logging.getLogger("wharf.proxy.wal")

_SEGMENT = re.compile(r"^seg-(\d{8})\.jsonl$")


def write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is out (a regular-file write can be short when interrupted)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class SegmentLog:
    """Numbered segments seg-00000001.jsonl ...; `rotate` starts a new one so older ones can be retired."""

    def __init__(self, directory: str | Path, fsync: bool = False):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.fd: int | None = None
        self.current = 0

    def segments(self) -> list[tuple[int, Path]]:
        found = []
        for p in self.dir.iterdir():
            m = _SEGMENT.match(p.name)
            if m:
                found.append((int(m.group(1)), p))
        return sorted(found)

    def open(self) -> None:
        """Start writing a segment numbered after every one on disk (left-overs stay for recovery)."""
        existing = self.segments()
        self.current = (existing[-1][0] if existing else 0) + 1
        self._open_current()

    def _open_current(self) -> None:
        path = self.dir / f"seg-{self.current:08d}.jsonl"
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # holds the calls' bodies: the owner's only
        os.fchmod(self.fd, 0o600)  # a file made before by an older version

    def append(self, line: bytes) -> None:
        write_all(self.fd, line)
        if self.fsync:
            os.fsync(self.fd)

    def rotate(self) -> int:
        """Close the current segment and open the next; returns the number of the closed one."""
        closed = self.current
        os.close(self.fd)
        self.current += 1
        self._open_current()
        return closed

    def retire(self, upto: int) -> None:
        """Delete segments numbered <= upto (their records are published elsewhere)."""
        for n, p in self.segments():
            if n <= upto and n != self.current:
                p.unlink(missing_ok=True)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def read_records(path: Path) -> tuple[list[dict], int]:
    """Parse a segment; returns (records, number of unreadable lines).

    A torn final line (no newline: the writer died mid-record) is expected after a crash and is
    not counted; an unreadable line elsewhere is counted so the caller keeps the file for a person.
    """
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline, else a torn record
    if tail:
        log.warning("%s: dropping a torn last record (%d bytes) left by a crash; it was never answered",
                    path, len(tail))
    records, bad = [], 0
    for i, line in enumerate(lines):
        if not line:
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError("not an object")
            records.append(rec)
        except ValueError as e:
            bad += 1
            log.error("%s:%d: unreadable WAL record (%s)", path, i + 1, e)
    return records, bad
