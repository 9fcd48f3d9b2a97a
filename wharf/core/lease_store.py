"""Where a run's lease lives (wharf/core/lease.py), as one compare-and-swap object: `read` gives the
holder and a tag of the version read; `write(holder, tag)` replaces exactly that version (tag
None: only where there is none) and answers the new tag, or None when another writer came first.

- S3: conditional PutObject (`If-None-Match: *`, `If-Match: <ETag>`) and DeleteObject (`If-Match`)
  through botocore (the uploads' client); the SeaweedFS the tests run answers 412 to a failed
  condition, as AWS S3 does.
- another URL (gs://, an fsspec scheme): read, compare, put; without a condition two takers in the
  same instant can both write, and the read-back each does after writing tells the loser.
- a local run dir: the same read-compare-write under an flock on the run dir itself (no lock
  file is left behind).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import functools
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

from wharf.core import atomic, objects, uploads


@dataclass(frozen=True)
class Holder:
    token: str  # this take's own id: what every check compares
    generation: int  # raised by each take: the fencing token
    host: str
    pid: int
    command: str
    since: float  # epoch seconds
    expires: float

    def describe(self) -> str:
        return (f"{self.command} on {self.host} (pid {self.pid}) since {iso(self.since)}, lease generation "
                f"{self.generation}, expiring {iso(self.expires)} unless renewed")

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), indent=1).encode()

    @classmethod
    def decode(cls, data: bytes) -> "Holder | None":
        """None for what is not a lease (a damaged object counts as no holder)."""
        try:
            raw = json.loads(data)
            return cls(**{f.name: raw[f.name] for f in dataclasses.fields(cls)})
        except (ValueError, TypeError, KeyError):
            return None


@dataclass(frozen=True)
class Seen:
    holder: Holder | None
    tag: str | None  # the version read (an ETag, a digest); None: there is no lease object


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


class Store(Protocol):
    def read(self) -> Seen: ...
    def write(self, holder: Holder, tag: str | None) -> str | None: ...
    def delete(self, tag: str) -> None: ...


def _digest(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


class S3Store:
    def __init__(self, url: str):
        _, self.bucket, self.key = objects.split_url(url)  # a `#` or `?` in a run's name is part of the key
        self.url = url

    @functools.cached_property
    def _s3(self):
        logging.getLogger("botocore").setLevel(logging.WARNING)  # not a line per client on where keys came from
        return uploads.s3_client()  # thread-safe once made: made once, under the lease's lock

    def _client(self):
        return self._s3

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except (ClientError, BotoCoreError) as e:
            raise objects.StorageError(f"{self.url}: cannot {doing} the run's lease: {e}") from None

    def read(self) -> Seen:
        from botocore.exceptions import ClientError

        with self._errors("read"):
            try:
                got = self._client().get_object(Bucket=self.bucket, Key=self.key)
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    return Seen(None, None)
                raise
            return Seen(Holder.decode(got["Body"].read()), got["ETag"])

    def write(self, holder: Holder, tag: str | None) -> str | None:
        from botocore.exceptions import ClientError

        cond = {"IfNoneMatch": "*"} if tag is None else {"IfMatch": tag}
        with self._errors("write"):
            try:
                return self._client().put_object(Bucket=self.bucket, Key=self.key, Body=holder.encode(),
                                                 ContentType="application/json", **cond)["ETag"]
            except ClientError as e:
                if _precondition_failed(e):
                    return None
                raise

    def delete(self, tag: str) -> None:
        from botocore.exceptions import ClientError

        with self._errors("release"):
            try:
                self._client().delete_object(Bucket=self.bucket, Key=self.key, IfMatch=tag)
            except ClientError as e:
                if not _precondition_failed(e):
                    raise


def _precondition_failed(e) -> bool:
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status in (409, 412) or e.response.get("Error", {}).get("Code") in ("PreconditionFailed",
                                                                              "ConditionalRequestConflict")


class ObjectStore:
    """Any other URL: no conditional writes (see the module's note)."""

    def __init__(self, url: str):
        self.url = url

    def read(self) -> Seen:
        try:
            data = objects.get(self.url)
        except objects.StorageError as e:
            if "no such object" in str(e):
                return Seen(None, None)
            raise
        return Seen(Holder.decode(data), _digest(data))

    def write(self, holder: Holder, tag: str | None) -> str | None:
        if self.read().tag != tag:
            return None
        objects.put(self.url, holder.encode())
        return _digest(holder.encode())

    def delete(self, tag: str) -> None:
        if self.read().tag == tag:
            objects.delete(self.url)


class FileStore:
    """A local run dir: read-compare-write under an exclusive flock on the dir."""

    def __init__(self, path: Path):
        self.path = path

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # the lock goes with it

    def _read(self) -> Seen:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return Seen(None, None)
        return Seen(Holder.decode(data), _digest(data))

    def read(self) -> Seen:
        with self._locked():
            return self._read()

    def write(self, holder: Holder, tag: str | None) -> str | None:
        with self._locked():
            if self._read().tag != tag:
                return None
            data = holder.encode()
            atomic.write_bytes(self.path, data)
            return _digest(data)

    def delete(self, tag: str) -> None:
        with self._locked():
            if self._read().tag == tag:
                self.path.unlink(missing_ok=True)


def store_for(url: str | None, root: Path, name: str) -> Store:
    if url is None:
        return FileStore(root / name)
    return S3Store(f"{url}/{name}") if url.startswith("s3://") else ObjectStore(f"{url}/{name}")
