"""Turn rows: WAL first, then published as parquet shards (wharf.schema TURNS) in the background.

Protocol, so that a row is never lost nor written twice:
1. `add(row)` appends the row to the current WAL segment and to `pending` in one synchronous step;
   `durable(seq)` then waits for the group-commit fsync that covers it (wal.py), and only then
   is the call answered.
2. `flush()` rotates the WAL (new rows go to a new segment), writes every pending row to
   `part-*.parquet` atomically (file and directory fsynced: schema.write_table), then deletes
   the rotated segments.
3. At start-up, left-over segments are read; rows whose request_id is already in a shard (a
   crash between 2's rename and delete) are skipped, the rest are published, then the segments go.

When the shards' dir mirrors object storage (runs_dir=s3://...: wharf/core/storage.py), publishing a
shard is its local write *and* its upload, one object in one PUT, before its WAL segments are
retired: an upload that fails leaves the rows pending, as a failed write does, and their retry
goes to the same key (an upload that landed before its check failed is overwritten, not
doubled; the round's fold drops a request_id seen twice besides). At start-up every
local shard the bucket lacks (a crash between the write and the upload) is uploaded. The WAL
itself never leaves the node's disk.
"""
from __future__ import annotations

import array
import asyncio
import fcntl
import logging
import os
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from wharf.core import atomic, schema, storage
from wharf.collect.proxy import jsonx
from wharf.collect.proxy.wal import SegmentLog, read_records

log = logging.getLogger("wharf.proxy.shards")


def shard_name() -> str:
    # Sorts by creation time; the random suffix keeps two processes or restarts apart.
    return f"part-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{time.time_ns() % 10**9:09d}-{uuid.uuid4().hex[:6]}.parquet"


def published_keys(out_dir: Path) -> tuple[set[str], dict[str, int]]:
    """request_ids already in shards, and the highest turn per rollout (only the needed columns are read)."""
    ids: set[str] = set()
    last_turn: dict[str, int] = {}
    for f in schema.shard_files(out_dir):
        try:
            pf = pq.ParquetFile(f)
        except Exception as e:  # noqa: BLE001 - any unreadable file: stop with its name
            raise schema.SchemaError(f"{f}: not a readable parquet file ({e}); move it out of {out_dir}") from None
        meta = pf.schema_arrow.metadata or {}
        if meta.get(b"table") != b"turns":
            raise schema.SchemaError(f"{f}: not a wharf turns shard; move it out of {out_dir}")
        t = pf.read(columns=["request_id", "rollout_id", "turn"])
        ids.update(t.column("request_id").to_pylist())
        for rid, turn in zip(t.column("rollout_id").to_pylist(), t.column("turn").to_pylist()):
            if turn > last_turn.get(rid, -1):
                last_turn[rid] = turn
    return ids, last_turn


_LIST_TYPES = {"prompt_token_ids": "i", "completion_token_ids": "i", "completion_logprobs": "f"}


def _list_column(values: list, code: str, value_type: pa.DataType) -> pa.Array:
    """list<int32|float32> from per-row arrays via one buffer join (pa.array on Python lists is ~50x slower)."""
    arrs = [v if isinstance(v, array.array) and v.typecode == code else array.array(code, v) for v in values]
    offsets = np.zeros(len(arrs) + 1, dtype=np.int32)
    np.cumsum([len(a) for a in arrs], out=offsets[1:])
    flat = np.frombuffer(b"".join(a.tobytes() for a in arrs), dtype=np.int32 if code == "i" else np.float32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=value_type))


def turns_table(rows: list[dict]) -> pa.Table:
    """Rows as the proxy keeps them (arrays; epoch-second floats) -> a TURNS table."""
    cols = []
    added = schema.ADDED_COLUMNS["turns"]  # a WAL line written before the column existed
    for f in schema.TURNS:
        values = [r[f.name] if f.name not in added else r.get(f.name, added[f.name]) for r in rows]
        if f.name in _LIST_TYPES:
            cols.append(_list_column(values, _LIST_TYPES[f.name], f.type.value_type))
        elif pa.types.is_timestamp(f.type):
            us = np.array([round(v * 1e6) if v is not None else 0 for v in values], dtype=np.int64)
            mask = np.array([v is None for v in values])
            cols.append(pa.array(us, type=pa.int64(), mask=mask).cast(f.type))
        else:
            cols.append(pa.array(values, type=f.type))
    return pa.Table.from_arrays(cols, schema=schema.TURNS)


def write_shard(path: Path, rows: list[dict]) -> Path:
    return schema.write_table(path, "turns", turns_table(rows))


def publish_shard(path: Path, rows: list[dict]) -> Path:
    """Write the shard and, in a mirror of object storage, upload it; no half-published shard stays behind."""
    write_shard(path, rows)
    try:
        storage.push_file(path)
    except BaseException:
        path.unlink(missing_ok=True)  # the rows stay pending in the WAL; the next flush publishes them
        raise
    return path


class TurnStore:
    def __init__(self, out_dir: str | Path, wal_dir: str | Path, shard_rows: int, shard_bytes: int,
                 shard_seconds: float, fsync: bool = True, on_sync=None):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.wal = SegmentLog(wal_dir, fsync=fsync, on_sync=on_sync)
        self.shard_rows = shard_rows
        self.shard_bytes = shard_bytes
        self.shard_seconds = shard_seconds
        self.pending: list[dict] = []
        self.pending_bytes = 0
        self.pending_by_rollout: dict[str, int] = {}
        self.last_turn: dict[str, int] = {}
        self.n_published = 0
        self.flush_errors = 0
        self._lock = asyncio.Lock()
        self._flush_task: asyncio.Task | None = None
        self._retry_name: str | None = None  # the shard a failed publish wrote: its rows' retry overwrites it
        self._timer: asyncio.Task | None = None

    # -- start-up ---------------------------------------------------------------------------
    def lock(self) -> None:
        """One proxy per WAL dir: a second one would retire segments the first still needs.

        flock is released by the kernel when the holder dies, even by SIGKILL, so a restart is never
        blocked by a stale lock.
        """
        self._lock_fd = os.open(self.wal.dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise RuntimeError(f"{self.wal.dir} is in use by another proxy process; give each proxy its own "
                               "proxy.out_dir (or proxy.wal_dir)") from None

    def recover(self) -> dict:
        """Fold left-over WAL segments into a shard (skipping rows already published), then open the WAL."""
        self.lock()
        try:
            return self._recover()
        except BaseException:
            os.close(self._lock_fd)  # a failed start must not keep the dir locked
            self._lock_fd = None
            raise

    def _recover(self) -> dict:
        ids, self.last_turn = published_keys(self.out_dir)
        segments = self.wal.segments()
        rows, kept, bad_files = [], set(), []
        for _, path in segments:
            records, bad = read_records(path)
            if bad:
                bad_files.append(path)
            for rec in records:
                if rec.get("request_id") in ids or rec.get("request_id") in kept:
                    continue
                kept.add(rec["request_id"])
                rows.append(rec)
        shard = None
        if rows:
            shard = write_shard(self.out_dir / shard_name(), rows)
        # Shards written before a crash cut their upload short (a plain local dir: nothing to do).
        # Only the shards: no WAL dir goes up, `_wal` or a Ray node's `_wal-<node>` (its lock, admin token).
        storage.push(self.out_dir, exclude=("*/*",))
        if rows:
            for r in rows:
                if r["turn"] > self.last_turn.get(r["rollout_id"], -1):
                    self.last_turn[r["rollout_id"]] = r["turn"]
        for _, path in segments:
            if path in bad_files:
                # Keep what could not be read for a person to look at, out of the replay path.
                path.rename(path.with_name(path.name + ".bad"))
            else:
                path.unlink()
        if segments:
            atomic.fsync_dir(self.wal.dir)  # the renames above, before new segments are numbered after them
        self.wal.open()
        info = {"segments": len(segments), "recovered_rows": len(rows), "shard": str(shard) if shard else None,
                "bad_segments": [str(p) for p in bad_files]}
        if segments:
            log.warning("recovered a left-over WAL: %s", info)
        return info

    def start(self) -> None:
        if self.shard_seconds > 0:
            self._timer = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.shard_seconds)
            if self.pending:
                await self._flush_logged()

    async def _flush_logged(self) -> None:
        try:
            await self.flush()
        except Exception:  # noqa: BLE001 - logged in flush; the rows stay pending and are retried
            pass

    # -- hot path ---------------------------------------------------------------------------
    def add(self, row: dict) -> int:
        """Write the row's WAL line (os.write: survives SIGKILL on return); its sequence number for `durable`."""
        line = jsonx.dumps(row) + b"\n"
        seq = self.wal.append(line)
        self.pending.append(row)
        self.pending_bytes += len(line)
        rid = row["rollout_id"]
        self.pending_by_rollout[rid] = self.pending_by_rollout.get(rid, 0) + 1
        if (len(self.pending) >= self.shard_rows or self.pending_bytes >= self.shard_bytes) and not (
            self._flush_task and not self._flush_task.done()
        ):
            self._flush_task = asyncio.get_running_loop().create_task(self._flush_logged())
        return seq

    async def durable(self, seq: int) -> None:
        """Wait until row `seq` survives a power cut (with fsync off: at once); WalSyncError if it cannot."""
        await self.wal.durable(seq)

    def has_pending(self, rollout_id: str) -> bool:
        return self.pending_by_rollout.get(rollout_id, 0) > 0

    # -- publishing -------------------------------------------------------------------------
    async def flush(self, rollout_id: str | None = None) -> list[str]:
        """Publish every row added before this call; returns the shard paths written (0 or 1).

        With `rollout_id`, only if that rollout has rows pending (waiting first for a flush in
        progress, which may hold its rows): closing a rollout does not cut a shard for nothing.
        """
        async with self._lock:
            if not self.pending or (rollout_id is not None and not self.has_pending(rollout_id)):
                return []
            closed = self.wal.rotate()
            rows, self.pending = self.pending, []
            nbytes, self.pending_bytes = self.pending_bytes, 0
            counts, self.pending_by_rollout = self.pending_by_rollout, {}
            # A retry goes to the key of the publish that failed: its upload may have landed before
            # its check failed, and a new key would then hold the same rows twice.
            path = self.out_dir / (self._retry_name or shard_name())
            try:
                await asyncio.to_thread(publish_shard, path, rows)
            except Exception:
                self._retry_name = path.name
                # Put the rows back (ahead of newer ones) and keep their segments: nothing is lost.
                self.flush_errors += 1
                log.exception("writing shard %s failed; %d rows stay pending in the WAL", path, len(rows))
                self.pending[:0] = rows
                self.pending_bytes += nbytes
                for rid, n in counts.items():
                    self.pending_by_rollout[rid] = self.pending_by_rollout.get(rid, 0) + n
                raise
            self._retry_name = None
            self.wal.retire(closed)
            self.n_published += len(rows)
            return [str(path)]

    async def close(self) -> None:
        if self._timer:
            self._timer.cancel()
        if self._flush_task:
            await self._flush_task
        await self.flush()
        await self.wal.drain()
        self.wal.close()
        if getattr(self, "_lock_fd", None) is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
