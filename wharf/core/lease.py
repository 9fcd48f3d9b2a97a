"""One writer per run: a lease kept in the run's own storage (`<run>/lease.json`, in the bucket for
an `s3://` run), taken by a driver (loop, collect, convert, train) before it writes, renewed by a
thread while it runs, and released when it exits.

A second driver on the run is refused with one line naming the holder (host, pid, since when,
expiry) and how to take over. A lease may be taken when it has expired, when its holder is a
process of this host that is gone (a killed driver resumed here), or with WHARF_TAKE_OVER=1. Each
take raises the lease's generation (the fencing token). Every push (wharf/core/storage.py) first
checks that this driver still holds the lease; once another has taken it, this driver's pushes
are refused and it stops, so nothing of a stale driver lands over the newer one's data.

On S3 the lease is written with conditional PUTs (`If-None-Match: *` to create it, `If-Match:
<ETag>` to renew or take it), so two drivers racing for it cannot both win; every write is also
read back (a store that ignores the conditions is caught by the read). A local run dir uses a
lock file around the same read-compare-write (wharf/core/lease_store.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

from wharf.core import storage
from wharf.core.errors import WharfError
from wharf.core.lease_store import Holder, Seen, Store, iso, store_for

log = logging.getLogger("wharf.lease")

NAME = "lease.json"
JOIN_ENV = "WHARF_LEASE"  # "<location> <token>": a child of the holder (an overlapped collect) writes under it
SECONDS_ENV = "WHARF_LEASE_S"  # how long a lease lasts unless renewed (renewed every third of it)
TAKE_OVER_ENV = "WHARF_TAKE_OVER"  # 1: take the lease even from a live holder (it stops at its next push)
DEFAULT_S = 120.0


class LeaseHeld(WharfError):
    """Another driver holds the run: nothing was written."""


class LeaseLost(WharfError):
    """Another driver took the run over: this one writes nothing more."""


def may_take(current: Holder | None, now: float, host: str, take_over: bool,
             alive: Callable[[int], bool]) -> bool:
    """Whether a driver on `host` may take the run from `current`."""
    if current is None or current.expires <= now or take_over:
        return True
    return current.host == host and (current.pid == os.getpid() or not alive(current.pid))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def held_message(location: str, holder: Holder) -> str:
    return (f"{location}: this run is held by {holder.describe()}: wait until then, or, if that driver is gone "
            f"for good, run again with {TAKE_OVER_ENV}=1 to take it over (that driver then stops at its next push)")


class Lease:
    """This process's hold on one run; `check` before every push."""

    def __init__(self, store: Store, location: str, command: str, seconds: float):
        self.store, self.location, self.command, self.seconds = store, location, command, seconds
        self.holder: Holder | None = None
        self.tag: str | None = None
        self.lost: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self, take_over: bool) -> "Lease":
        seen, now, host = self.store.read(), time.time(), socket.gethostname()
        if seen.holder is not None and not may_take(seen.holder, now, host, take_over, pid_alive):
            raise LeaseHeld(held_message(self.location, seen.holder))
        generation = (seen.holder.generation if seen.holder else 0) + 1
        me = Holder(uuid.uuid4().hex, generation, host, os.getpid(), self.command, now, now + self.seconds)
        tag = self.store.write(me, seen.tag)
        now_seen = self.store.read()
        if tag is None or now_seen.holder is None or now_seen.holder.token != me.token:  # another driver won
            raise LeaseHeld(held_message(self.location, now_seen.holder or me))
        if seen.holder is not None and seen.holder.token != me.token:
            log.warning("%s: took the run over from %s", self.location, seen.holder.describe())
        self.holder, self.tag = me, tag
        return self

    def renew(self) -> None:
        with self._lock:
            self._renew()

    def _renew(self) -> None:
        if self.lost:
            raise LeaseLost(self.lost)
        new = dataclasses.replace(self.holder, expires=time.time() + self.seconds)
        tag = self.store.write(new, self.tag)
        if tag is None:
            self._lose(self.store.read())
        self.holder, self.tag = new, tag
        self._verify(self.store.read())

    def check(self) -> None:
        """Still ours (renewed first when a third of it is left), else LeaseLost."""
        with self._lock:
            if self.lost:
                raise LeaseLost(self.lost)
            if time.time() > self.holder.expires - self.seconds / 3:
                self._renew()
            else:
                self._verify(self.store.read())

    def _verify(self, seen: Seen) -> None:
        if seen.holder is None or seen.holder.token != self.holder.token:
            self._lose(seen)

    def _lose(self, seen: Seen) -> None:
        other = seen.holder.describe() if seen.holder else "nobody (the lease was removed)"
        self.lost = (f"{self.location}: this driver's lease (generation {self.holder.generation}) was taken over; "
                     f"the run is now held by {other}: stopping, nothing more of this driver is written")
        raise LeaseLost(self.lost)

    def start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._renew_loop, name="wharf-lease", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            try:
                self.renew()
            except LeaseLost as e:
                log.error("%s", e)
                return
            except storage.StorageError as e:  # a passing failure: the next tick tries again
                log.warning("%s: renewing the lease failed (%s); it expires %s", self.location, e,
                            iso(self.holder.expires))

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._lock:
            if not self.lost and self.tag is not None:
                with contextlib.suppress(storage.StorageError):
                    self.store.delete(self.tag)


class Joined:
    """A child process of the holder (an overlapped collect): it writes under the parent's lease,
    which it checks but never renews or releases."""

    def __init__(self, store: Store, location: str, token: str):
        self.store, self.location, self.token = store, location, token

    def check(self) -> None:
        holder = self.store.read().holder
        if holder is None or holder.token != self.token:
            other = holder.describe() if holder else "nobody"
            raise LeaseLost(f"{self.location}: the lease this process writes under was taken over; the run is "
                            f"now held by {other}: stopping, nothing more of this process is written")

    def release(self) -> None:
        pass


_HELD: dict[str, list] = {}  # location -> [lease, users]: nested stages of one driver share it


def _seconds() -> float:
    raw = os.environ.get(SECONDS_ENV)
    try:
        return float(raw) if raw else DEFAULT_S
    except ValueError:
        raise WharfError(f"{SECONDS_ENV}={raw!r}: not a number of seconds") from None


@contextlib.contextmanager
def held(root: str | Path, command: str, take_over: bool | None = None) -> Iterator[Lease | Joined | None]:
    """Hold run `root` (its local dir or mirror) for the block: taken, renewed, every push under
    it checked, released at the end. Nested holds of one run in a process share the lease."""
    if os.environ.get("RANK", "0") != "0":  # accelerate's other ranks push nothing
        yield None
        return
    url = storage.url_of(root)
    location = f"{url}/{NAME}" if url else os.path.abspath(Path(root) / NAME)  # as a child process names it too
    if location in _HELD:
        _HELD[location][1] += 1
        try:
            yield _HELD[location][0]
        finally:
            _HELD[location][1] -= 1
        return
    if url:
        storage.check(url)  # a missing bucket is named as every stage names it
    made = _first_missing(Path(root)) if url is None else None
    try:
        with _hold(location, url, Path(root), command, take_over) as lease:
            yield lease
    finally:
        _remove_if_empty(Path(root), made)


def _first_missing(root: Path) -> Path | None:
    """The outermost dir of `root` that does not exist yet (the lease creates it)."""
    missing = None
    for d in (root, *root.parents):
        if d.exists():
            return missing
        missing = d
    return missing


def _remove_if_empty(root: Path, made: Path | None) -> None:
    """A driver that stopped before writing leaves no run dir the lease made."""
    if made is None:
        return
    for d in (root, *root.parents):
        with contextlib.suppress(OSError):
            d.rmdir()  # only an empty one
        if d == made:
            return


@contextlib.contextmanager
def _hold(location: str, url: str | None, root: Path, command: str, take_over: bool | None):
    store = store_for(url, root, NAME)
    joined_at, _, token = os.environ.get(JOIN_ENV, "").rpartition(" ")  # a path may hold spaces; a token none
    if joined_at == location and token:
        lease: Lease | Joined = Joined(store, location, token)
    else:
        take_over = os.environ.get(TAKE_OVER_ENV) == "1" if take_over is None else take_over
        lease = Lease(store, location, command, _seconds()).take(take_over)
        lease.start_renewing()
    unguard = storage.guard_writes(lambda u: lease.check() if url and (u == url or u.startswith(f"{url}/")) else None)
    before = os.environ.get(JOIN_ENV)
    if isinstance(lease, Lease):
        os.environ[JOIN_ENV] = f"{location} {lease.holder.token}"  # children write under it
    _HELD[location] = [lease, 1]
    try:
        yield lease
    finally:
        del _HELD[location]
        unguard()
        _restore_env(before)
        lease.release()


def _restore_env(before: str | None) -> None:
    if before is None:
        os.environ.pop(JOIN_ENV, None)
    else:
        os.environ[JOIN_ENV] = before
