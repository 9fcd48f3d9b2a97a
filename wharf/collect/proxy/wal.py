"""Write-ahead log: append-only JSON-lines segments, fsynced by group commit before a call is answered.

A record is one line written by one `os.write` on an O_APPEND descriptor: once the call returns,
the bytes are in the kernel's page cache and survive SIGKILL of the process. For a power cut the
page cache is not enough: `durable(seq)` waits until an fsync covering record `seq` (and the
directory entry of its segment) has completed. One sync thread serves every call in flight: while
one fsync runs, the records appended meanwhile wait for the next, so a batch of calls shares one
fsync (group commit), and the event loop never blocks on the disk.
With `fsync=False` (`proxy.wal_fsync=false`) `durable` returns at once: SIGKILL-safe, not
power-loss safe. A crash mid-write can leave a torn last line; that call was never answered, so
readers skip it.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import re
import threading
from pathlib import Path
from typing import Callable

from wharf.core.atomic import fsync_dir

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


class SyncThread:
    """One thread for the fsyncs: the loop hands it a batch and gets a future back (cheaper than
    asyncio.to_thread's executor per call, which shows at one fsync per call)."""

    def __init__(self, name: str = "wharf-wal-sync"):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._name = name
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable, *args) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
            self._thread.start()
        self._q.put((loop, fut, fn, args))
        return fut

    def _main(self) -> None:
        while (item := self._q.get()) is not None:
            loop, fut, fn, args = item
            try:
                fn(*args)
                err = None
            except Exception as e:  # noqa: BLE001 - any failure fails the batch; the thread must live on
                err = e
            loop.call_soon_threadsafe(_settle, fut, err)

    def stop(self) -> None:
        if self._thread is not None:
            self._q.put(None)
            self._thread.join(10)
            self._thread = None


def _settle(fut: asyncio.Future, err: Exception | None) -> None:
    if not fut.done():
        fut.set_exception(err) if err is not None else fut.set_result(None)


class SegmentLog:
    """Numbered segments seg-00000001.jsonl ...; `rotate` starts a new one so older ones can be retired."""

    def __init__(self, directory: str | Path, fsync: bool = True, on_sync: Callable[[int], None] | None = None):
        """`on_sync(n)`: called after each group fsync with the number of records it made durable."""
        self.dir = Path(directory)
        self.on_sync = on_sync
        self.fsync = fsync
        if not self.dir.is_dir():
            self.dir.mkdir(parents=True)
            if fsync:
                fsync_dir(self.dir.parent)  # the new dir's own entry: its segments are found after a power cut
        self.fd: int | None = None
        self.current = 0
        self.written = 0  # records appended so far (a record's sequence number is the count after it)
        self.synced = 0  # records covered by a completed fsync
        self.n_syncs = 0
        self._rotated: list[int] = []  # descriptors of rotated segments, closed once synced
        self._dir_dirty = False  # a segment was created since the last directory fsync
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._thread = SyncThread()
        self._busy = False  # a batch is scheduled or its fsync is running
        self._idle: asyncio.Event | None = None
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
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._waiters.append((seq, fut))
        if not self._busy:
            self._busy = True
            if self._idle is None:
                self._idle = asyncio.Event()
            self._idle.clear()
            loop.call_soon(self._start)  # one loop pass later: calls answered in the same pass join the batch
        await fut  # a cancelled caller leaves its batch alone (_release skips a done future)

    def _start(self) -> None:
        """Hand the sync thread every record written so far (and the descriptors they are in)."""
        target, fds, rotated = self.written, [*self._rotated, self.fd], self._rotated
        self._rotated, dirty, self._dir_dirty = [], self._dir_dirty, False
        done = self._thread.submit(_sync_all, fds, self.dir if dirty else None)
        done.add_done_callback(lambda f: self._finished(f, target, rotated))

    def _finished(self, done: asyncio.Future, target: int, rotated: list[int]) -> None:
        """On the loop after a batch's fsync: release its waiters; start the next batch if calls wait."""
        for fd in rotated:
            os.close(fd)
        self.n_syncs += 1
        if done.exception() is not None and self._broken is None:
            self._broken = done.exception()
            log.error("fsync of the WAL in %s failed: %s; no further call will be answered", self.dir, self._broken)
        if self._broken is None:
            if self.on_sync is not None:
                self.on_sync(target - self.synced)
            self.synced = target
        self._release(target)
        if self._waiters and self._broken is None:
            self._start()  # the records appended during this fsync: their batch starts now
        else:
            self._busy = False
            self._idle.set()

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
        if self.fsync and self._busy:
            self._rotated.append(self.fd)  # the sync thread may be fsyncing it right now
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
        """Wait for the batch in progress (before closing: the sync thread may use the current descriptor)."""
        if self._busy:
            await self._idle.wait()

    def close(self) -> None:
        self._thread.stop()
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
