"""Runs in object storage: `runs_dir` (or a job dir, convert.out_dir, ...) may be a URL,
`s3://bucket/prefix` or anything else pyarrow's (or fsspec's) file systems open.

The stages keep working on local paths. A URL has a *mirror* on this machine, a directory in
the cache (`local_path`), and the layout hands the mirror's paths to every stage; each stage pulls
what it reads from the bucket into the mirror before it starts (`pull`) and pushes what it made
(`push`, `push_file`). So the tools that want a path (peft, safetensors, matplotlib, the local
engine loading an adapter) get one, and a local runs_dir is used as it always was: no copy, no
extra call (every function here returns at once for a path that is not a mirror).

Object stores have no rename: an object appears whole when its one upload completes, or not at
all, and a listing shows only completed objects. `push` uploads the files that mark a directory
as whole (a manifest, index.json, adapter_config.json: `last`) after everything they describe.
S3 is configured as S3 users expect: AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3), AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_REGION (the object calls themselves: wharf/core/objects.py; uploads,
all or nothing and checked by Content-MD5: wharf/core/uploads.py).

The bucket is the truth and a mirror only a cache of it: each transfer stamps the file it moved
with the object's size and ETag, and a file counts as the object only while the bucket holds the
object stamped (see the stamps section).
"""
from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Iterator

from wharf.core import atomic, objects, uploads
from wharf.core.errors import WharfError
from wharf.core.mirror_origin import check_origin
from wharf.core.model_store import cache_dir
# The object API, as this module's users call it (storage.put, storage.listing, ...).
from wharf.core.objects import (Entry, Remote, StorageError, _errors, _etag, check, get, head, listing, put, remote,  # noqa: F401
                           s3_filesystem)


TRANSFERS = 8  # objects moved at once by pull and push
# Checks run before every push: each raises to refuse a write (wharf/core/lease.py: a driver that
# no longer holds its run's lease writes nothing more).
_WRITE_CHECKS: list[Callable[[str], None]] = []


def guard_writes(refuse: Callable[[str], None]) -> Callable[[], None]:
    """Run `refuse(url)` before every push from now on; returns what removes it again."""
    _WRITE_CHECKS.append(refuse)
    return lambda: _WRITE_CHECKS.remove(refuse)


def _check_write(url: str) -> None:
    for refuse in list(_WRITE_CHECKS):
        refuse(url)


def is_remote(location: str | Path) -> bool:
    """A URL with a scheme other than file:// (a Path is always local)."""
    return isinstance(location, str) and "://" in location and not location.startswith("file://")


def mirror_root() -> Path:
    """Where the mirrors of remote locations live: <root>/<scheme>/<bucket>/<key>, the root being
    WHARF_MIRROR (a node's local disk) or <cache>/remote."""
    return Path(os.path.abspath(os.environ.get("WHARF_MIRROR") or cache_dir() / "remote"))


def local_path(location: str | Path) -> Path:
    """The local directory `location` is worked on in: itself, or its mirror for a URL."""
    if not is_remote(location):
        return Path(str(location).removeprefix("file://"))
    scheme, bucket, key = objects.split_url(location)
    if not bucket:
        raise StorageError(f"{location}: a storage URL needs a bucket (scheme://bucket/prefix)")
    check_origin(mirror_root(), scheme, bucket)
    return mirror_root() / scheme / bucket / key


def url_of(path: str | Path) -> str | None:
    """The URL a mirror path stands for; None for a plain local path."""
    try:
        parts = Path(os.path.abspath(path)).relative_to(mirror_root()).parts
    except ValueError:
        return None
    if len(parts) < 2:
        return None
    return f"{parts[0]}://" + "/".join(parts[1:])


def _mirrored(path: str | Path) -> str | None:
    """url_of for a transfer: the URL, once its mirror is known to keep stamps (mirror_origin.py)."""
    url = url_of(path)
    if url is not None:
        scheme, bucket, _ = objects.split_url(url)
        check_origin(mirror_root(), scheme, bucket)
    return url


def describe(path: str | Path) -> str:
    """How to name `path` to a person: its URL when it mirrors one."""
    return url_of(path) or str(path)


def delete(url: str) -> None:
    """Delete the object, and forget this mirror's stamp of it."""
    objects.delete(url)
    _drop_stamp(url)


# -- stamps: which object a mirror's file was last exchanged with ---------------------------------
# A mirror is a cache of the bucket, never the other way round. Each file a transfer moves gets a
# stamp (outside the mirror, under <mirror root>/.stamps): the object's URL, size and ETag, and the
# file's own size and time then. A file counts as the object only while the bucket still holds the
# object stamped; a file with a stamp whose object is gone (a deleted prefix, a new empty bucket)
# is a stale copy. A file with no stamp is this machine's own write that never went up.
def _stamp_path(url: str) -> Path:
    h = hashlib.sha1(url.encode()).hexdigest()
    return mirror_root() / ".stamps" / h[:2] / f"{h[2:]}.json"


def _read_stamp(url: str) -> dict | None:
    try:
        stamp = json.loads(_stamp_path(url).read_text())
    except (OSError, ValueError):
        return None
    return stamp if stamp.get("url") == url else None


def _write_stamp(url: str, obj: Entry, local: os.stat_result) -> None:
    atomic.write_json(_stamp_path(url), {"url": url, "size": obj.size, "etag": obj.etag, "mtime_ns": obj.mtime_ns,
                                         "local": [local.st_size, local.st_mtime_ns]}, indent=None)


def _drop_stamp(url: str) -> None:
    _stamp_path(url).unlink(missing_ok=True)


def _is_stamped(stamp: dict, obj: Entry) -> bool:
    """`obj` is the object `stamp` names: the same size and ETag (its time only where no ETag is known)."""
    if stamp["size"] != obj.size:
        return False
    if stamp.get("etag") and obj.etag:
        return stamp["etag"] == obj.etag
    return stamp.get("mtime_ns") == obj.mtime_ns and bool(obj.mtime_ns)


def _untouched(stamp: dict, path: Path) -> bool:
    """The file is as the transfer left it (not written since)."""
    st = path.stat()
    return stamp["local"] == [st.st_size, st.st_mtime_ns]


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


# -- mirrors -----------------------------------------------------------------------------------
CHUNK = 8 << 20  # transfers stream: no whole object (an optimizer state is GBs) is ever held in memory


def _download(url: str, dest: Path, listed: Entry) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.part")
    r = remote(url)
    try:
        size = 0
        with _errors(url, "read"):
            with r.fs.open_input_stream(r.path) as src, open(tmp, "wb") as out:
                etag = _etag(src.metadata()) or listed.etag
                while chunk := src.read(CHUNK):
                    size += out.write(chunk)
        os.replace(tmp, dest)
        _write_stamp(url, Entry(size, listed.mtime_ns, etag), dest.stat())
    finally:
        tmp.unlink(missing_ok=True)


def _matches(rel: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(rel, p) for p in patterns)


def _hidden(rel: str) -> bool:
    """Temp files and dirs (`.name.tmp`, `.adapter.tmp`, downloads in progress) never travel."""
    return any(part.startswith(".") for part in rel.split("/"))


def _local_files(root: Path, include: tuple = ("*",), exclude: tuple = ()) -> dict[str, Path]:
    found = {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()} if root.is_dir() else {}
    return {rel: p for rel, p in found.items()
            if not _hidden(rel) and _matches(rel, include) and not _matches(rel, exclude)}


def _holds(url: str, dest: Path, listed: Entry) -> bool:
    """Whether the mirror's file may stand for the object: the bucket still holds the object it was
    last exchanged with (written here since, it is newer work of this machine: kept)."""
    if not dest.is_file():
        return False
    stamp = _read_stamp(url)
    if stamp is None:  # never exchanged: the same bytes (size, then MD5 against the ETag) or the bucket's
        if dest.stat().st_size != listed.size:
            return False
        obj = head(url)
        if obj.etag and "-" not in obj.etag and obj.etag == _md5(dest):
            _write_stamp(url, obj, dest.stat())
            return True
        return False
    return stamp["size"] == listed.size and _is_stamped(stamp, head(url))


def pull(directory: str | Path, include: Iterable[str] = ("*",)) -> int:
    """Make the mirror dir agree with the bucket for the objects that match `include` (patterns on
    the relative name; `*` crosses `/`): fetch what it lacks or holds another version of (checked
    by size and ETag), and remove copies of objects the bucket no longer has. Files this machine
    wrote since their last transfer are kept unless the bucket's object changed meanwhile: the
    bucket is the truth. The count fetched."""
    url = _mirrored(directory)
    if url is None:
        return 0
    root, include = Path(directory), tuple(include)
    objects = {rel: e for rel, e in listing(url).items() if not _hidden(rel) and _matches(rel, include)}
    held = _parallel(_holds, [(f"{url}/{rel}", root / rel, e) for rel, e in objects.items()])
    todo = [(f"{url}/{rel}", root / rel, e) for (rel, e), ok in zip(objects.items(), held) if not ok]
    _parallel(_download, todo)
    for rel, path in _local_files(root, include).items():
        if rel not in objects and _gone(path, f"{url}/{rel}"):
            path.unlink()  # a copy of an object that is gone: the bucket says it does not exist
            _drop_stamp(f"{url}/{rel}")
    return len(todo)


def pull_file(path: str | Path) -> bool:
    """One file of a mirror as the bucket has it (fetched, kept, or removed when the bucket has
    none); False for a plain local path."""
    path = Path(path)
    if url_of(path) is None:
        return False
    pull(path.parent, (path.name,))
    return True


def _parallel(fn, calls: list[tuple]) -> list:
    """fn(*args) for each, a few at a time (an object store's latency, not its bandwidth, is what
    a run's many small files pay); their results in order, or the first error."""
    if len(calls) <= 1:
        return [fn(*args) for args in calls]
    with ThreadPoolExecutor(min(TRANSFERS, len(calls))) as pool:
        return [f.result() for f in [pool.submit(fn, *args) for args in calls]]


def push_file(path: str | Path) -> bool:
    """Upload one file of a mirror (whole, in one upload); False for a plain local path."""
    url = _mirrored(path)
    if url is None:
        return False
    _check_write(url)
    _upload(Path(path), url)
    return True


def _upload(path: Path, url: str) -> None:
    """Upload the file whole or not at all, checked (wharf/core/uploads.py), and stamp it. A file
    still growing (a log) goes up as far as it was when opened; its stamp then says it changed
    since, so the next push sends it again."""
    before = path.stat()
    _write_stamp(url, uploads.upload(path, url, CHUNK), before)


def push(directory: str | Path, last: Iterable[str] = (), exclude: Iterable[str] = (),
         delete_stale: bool = False, remove: Iterable[str] = (), withdraw: bool = True) -> int:
    """Upload a mirror dir's files that are new or changed since their last upload, the `last`
    ones (relative names: markers) after all others, so a reader that sees them sees the rest;
    with `delete_stale`, objects with no local file (a replaced convert) go before `last` does;
    `remove` names objects to delete then (only those: compacted shards, not one that landed
    since). When anything is rewritten, the markers the bucket holds are withdrawn first (unless
    `withdraw` is False: the marker there already says "not done", e.g. a `running` manifest, and
    is replaced in place, last): a reader meanwhile sees no marker (not done), never an old one
    naming new or missing files, and a push cut short leaves it so. Files matching `exclude` (and
    hidden ones) stay local. The count uploaded."""
    url = _mirrored(directory)
    if url is None:
        return 0
    _check_write(url)
    root, exclude, last = Path(directory), tuple(exclude), tuple(last)
    there = listing(url)
    local = _local_files(root, exclude=exclude)
    for rel in [rel for rel, p in local.items() if rel not in there and _gone(p, f"{url}/{rel}")]:
        local.pop(rel).unlink()  # a copy of an object deleted since: never uploaded back
        _drop_stamp(f"{url}/{rel}")
    changed = [rel for rel, p in local.items() if _changed(p, f"{url}/{rel}", there.get(rel))]
    stale = [rel for rel in there if delete_stale and rel not in local and not _matches(rel, exclude)]
    stale += [rel for rel in remove if rel in there and rel not in local and rel not in stale]
    body = [rel for rel in changed if rel not in last]
    markers = [rel for rel in last if rel in local and (rel in changed or body or stale)]
    if withdraw:
        _parallel(delete, [(f"{url}/{rel}",) for rel in markers if rel in there])
    _parallel(_upload, [(local[rel], f"{url}/{rel}") for rel in body])
    _parallel(delete, [(f"{url}/{rel}",) for rel in stale])
    for rel in markers:  # in the order given, after everything else
        _upload(local[rel], f"{url}/{rel}")
    return len(set(body) | set(markers))


def _gone(path: Path, url: str) -> bool:
    """A file as a transfer left it whose object the bucket no longer holds."""
    stamp = _read_stamp(url)
    return stamp is not None and _untouched(stamp, path)


def _changed(path: Path, url: str, entry: Entry | None) -> bool:
    """Not in the bucket, never uploaded from here, written since, or replaced there since."""
    stamp = _read_stamp(url)
    return entry is None or stamp is None or not _untouched(stamp, path) or stamp["size"] != entry.size


@contextlib.contextmanager
def urls_in_errors() -> Iterator[None]:
    """A WharfError that names a mirror path names its URL instead (the cache is an implementation detail)."""
    try:
        yield
    except WharfError as e:
        root = re.escape(str(mirror_root()))
        text = re.sub(root + r"/([a-z0-9+.-]+)/", lambda m: f"{m.group(1)}://", str(e))
        if text != str(e):
            e.args = (text,)
        raise
