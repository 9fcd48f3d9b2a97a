"""Write-ahead log: append-only JSON-lines segments, fsynced by group commit before a call is answered.

A record is one line written by one `os.write` on an O_APPEND descriptor: once the call returns,
the bytes are in the kernel's page cache and survive SIGKILL of the process. For a power cut the
page cache is not enough: `durable(seq)` waits until an fsync covering record `seq` (and the
directory entry of its segment) has completed. One sync task serves every call in flight: while
one fsync runs, the records appended meanwhile wait for the next, so a batch of calls shares one
fsync (group commit) and the event loop never blocks on the disk (the fsync runs in a thread).
With `fsync=False` (`proxy.wal_fsync=false`) `durable` returns at once: SIGKILL-safe, not
power-loss safe. A crash mid-write can leave a torn last line; that call was never answered, so
readers skip it.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from pathlib import Path
from typing import Callable

from collect.schema import fsync_dir

log = logging.getLogger("wharf.proxy.wal")

_SEGMENT = re.compile(r"^seg-(\d{8})\.jsonl$")


def write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is out (a regular-file write can be short when interrupted)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class WalSyncError(OSError):
    """An fsync of the WAL failed: what the kernel holds of it is unknown, so nothing more is acknowledged."""


class SegmentLog:
    """Numbered segments seg-00000001.jsonl ...; `rotate` starts a new one so older ones can be retired."""

    def __init__(self, directory: str | Path, fsync: bool = True, on_sync: Callable[[int], None] | None = None):
        """`on_sync(n)`: called after each group fsync with the number of records it made durable."""
        self.dir = Path(directory)
        self.on_sync = on_sync
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.fd: int | None = None
        self.current = 0
        self.written = 0  # records appended so far (a record's sequence number is the count after it)
        self.synced = 0  # records covered by a completed fsync
        self.n_syncs = 0
        self._rotated: list[int] = []  # descriptors of rotated segments, closed once synced
        self._dir_dirty = False  # a segment was created since the last directory fsync
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._syncer: asyncio.Task | None = None
        self._broken: OSError | None = None

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
        self._dir_dirty = True

    def append(self, line: bytes) -> int:
        """Write one record (in the page cache on return); its sequence number, for `durable`."""
        write_all(self.fd, line)
        self.written += 1
        return self.written

    async def durable(self, seq: int) -> None:
        """Return once record `seq` is on disk (WalSyncError if an fsync failed); at once without fsync."""
        if self._broken is not None:
            raise WalSyncError(f"an earlier fsync of {self.dir} failed ({self._broken}); restart the proxy")
        if not self.fsync or seq <= self.synced:
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((seq, fut))
        if self._syncer is None or self._syncer.done():
            self._syncer = asyncio.get_running_loop().create_task(self._sync_loop())
        await asyncio.shield(fut)  # a cancelled caller must not cancel the batch's fsync

    async def _sync_loop(self) -> None:
        """One fsync per round covers every record written before it began; then its waiters go."""
        while self._waiters:
            target, fds, rotated = self.written, [*self._rotated, self.fd], self._rotated
            self._rotated, dirty, self._dir_dirty = [], self._dir_dirty, False
            try:
                await asyncio.to_thread(_sync_all, fds, self.dir if dirty else None)
            except OSError as e:
                log.error("fsync of the WAL in %s failed: %s; no further call will be answered", self.dir, e)
                self._broken = e
            finally:
                for fd in rotated:
                    os.close(fd)
            self.n_syncs += 1
            if self._broken is None:
                if self.on_sync is not None:
                    self.on_sync(target - self.synced)
                self.synced = target
            self._release(target)

    def _release(self, upto: int) -> None:
        keep = []
        for seq, fut in self._waiters:
            if seq > upto and self._broken is None:
                keep.append((seq, fut))
            elif not fut.done():
                if self._broken is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(WalSyncError(f"fsync of {self.dir} failed: {self._broken}"))
        self._waiters = keep

    def rotate(self) -> int:
        """Start the next segment; returns the number of the closed one (closed after its last fsync)."""
        closed = self.current
        if self.fsync and self._syncer is not None and not self._syncer.done():
            self._rotated.append(self.fd)  # the sync task may be fsyncing it right now
        else:
            if self.fsync and self.synced < self.written:
                os.fdatasync(self.fd)  # records nobody waits for yet (rare: only outside the proxy's hot path)
            os.close(self.fd)
        self.current += 1
        self._open_current()
        return closed

    def retire(self, upto: int) -> None:
        """Delete segments numbered <= upto (their records are published elsewhere)."""
        for n, p in self.segments():
            if n <= upto and n != self.current:
                p.unlink(missing_ok=True)

    async def drain(self) -> None:
        """Wait for the sync task (before closing: it may use the current descriptor)."""
        if self._syncer is not None:
            await asyncio.gather(self._syncer, return_exceptions=True)

    def close(self) -> None:
        for fd in self._rotated:
            os.close(fd)
        self._rotated = []
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _sync_all(fds: list[int], directory: Path | None) -> None:
    for fd in fds:
        os.fdatasync(fd)  # data and the size it needs to be read back; not the times (cheaper than fsync)
    if directory is not None:
        fsync_dir(directory)


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
