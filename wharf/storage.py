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
AWS_SECRET_ACCESS_KEY, AWS_REGION.
"""
from __future__ import annotations

import contextlib
import fnmatch
import functools
import os
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from wharf.errors import WharfError
from wharf.model_store import cache_dir

if TYPE_CHECKING:  # pyarrow loads when a URL is used: a local run (and layout's importers) never pays for it
    import pyarrow.fs as pafs


TRANSFERS = 8  # objects moved at once by pull and push


class StorageError(WharfError, OSError):
    """A bucket that cannot be reached, read or written; the message names the URL and what to check."""


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
    u = urlsplit(str(location))
    if not u.netloc:
        raise StorageError(f"{location}: a storage URL needs a bucket (scheme://bucket/prefix)")
    return mirror_root() / u.scheme / u.netloc / u.path.strip("/")


def url_of(path: str | Path) -> str | None:
    """The URL a mirror path stands for; None for a plain local path."""
    try:
        parts = Path(os.path.abspath(path)).relative_to(mirror_root()).parts
    except ValueError:
        return None
    if len(parts) < 2:
        return None
    return f"{parts[0]}://" + "/".join(parts[1:])


def describe(path: str | Path) -> str:
    """How to name `path` to a person: its URL when it mirrors one."""
    return url_of(path) or str(path)


# -- file systems ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Remote:
    url: str  # scheme://bucket/key
    fs: pafs.FileSystem
    path: str  # bucket/key, as `fs` names it


def remote(url: str) -> Remote:
    u = urlsplit(url)
    return Remote(url.rstrip("/"), _filesystem(u.scheme, _s3_env() if u.scheme == "s3" else ()),
                  f"{u.netloc}/{u.path.strip('/')}".rstrip("/"))


def _s3_env() -> tuple:
    names = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
             "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")
    return tuple(os.environ.get(n) for n in names)  # a change of any of them is another file system


@functools.lru_cache(maxsize=8)
def _filesystem(scheme: str, env: tuple) -> pafs.FileSystem:
    import pyarrow as pa
    import pyarrow.fs as pafs

    if scheme == "s3":
        return s3_filesystem()
    try:
        return pafs.FileSystem.from_uri(f"{scheme}://")[0]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
        try:
            import fsspec
            fs = fsspec.filesystem(scheme)
        except (ImportError, ValueError):
            raise StorageError(f"{scheme}://: neither pyarrow nor fsspec opens this scheme ({e})") from None
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


def s3_filesystem(**extra) -> pafs.S3FileSystem:
    """S3 from the usual AWS variables. pyarrow reads the credentials and region itself; the
    endpoint (a MinIO, SeaweedFS or other S3-compatible server) is passed on explicitly."""
    import pyarrow.fs as pafs

    kw: dict = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        u = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        kw.update(endpoint_override=u.netloc, scheme=u.scheme)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        kw["region"] = region
    # allow_delayed_open: an object smaller than a part goes up in one PutObject, not a multipart upload.
    return pafs.S3FileSystem(**{"allow_delayed_open": True, **kw, **extra})


_HINTS = (
    (re.compile(r"NO_?SUCH_?BUCKET|bucket .* (does not exist|not found)", re.I),
     "the bucket does not exist: create it, or fix runs_dir"),
    (re.compile(r"INVALID_?ACCESS_?KEY|SIGNATURE_?DOES_?NOT_?MATCH|ACCESS_?DENIED|Forbidden|HTTP status 403", re.I),
     "access refused: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
    (re.compile(r"Path does not exist|NO_?SUCH_?KEY", re.I), "no such object"),
    (re.compile(r"curlCode|Couldn't connect|connection refused|NETWORK_CONNECTION|Could not resolve", re.I),
     "nothing answers: check AWS_ENDPOINT_URL"),
)


@contextlib.contextmanager
def _errors(url: str, doing: str) -> Iterator[None]:
    """Any failure of the file system as one StorageError naming the URL and what to check."""
    import pyarrow as pa

    try:
        yield
    except StorageError:
        raise
    except (OSError, pa.ArrowException) as e:
        text = str(e)
        hint = next((h for pattern, h in _HINTS if pattern.search(text)), "see the error")
        raise StorageError(f"{url}: cannot {doing}: {hint} ({text.strip().splitlines()[0][:300]})") from None


# -- objects -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    size: int
    mtime_ns: int


def listing(url: str) -> dict[str, Entry]:
    """Every object under `url` (relative posix name -> size and time); {} when there is none."""
    import pyarrow.fs as pafs

    r = remote(url)
    with _errors(url, "list"):
        infos = r.fs.get_file_info(pafs.FileSelector(r.path, recursive=True, allow_not_found=True))
    found = {i.path[len(r.path):].lstrip("/"): Entry(i.size, i.mtime_ns or 0)
             for i in infos if i.type == pafs.FileType.File}
    if not found and url.startswith("s3://"):
        check(url)  # nothing under a prefix is fine; no bucket is an error (S3 lists it as empty)
    return found


def put(url: str, data: bytes) -> None:
    """One object in one upload: readers see all of it or none of it."""
    r = remote(url)
    with _errors(url, "write"):
        with r.fs.open_output_stream(r.path) as f:
            f.write(data)


def get(url: str) -> bytes:
    r = remote(url)
    with _errors(url, "read"):
        with r.fs.open_input_stream(r.path) as f:
            return f.read()


def delete(url: str) -> None:
    r = remote(url)
    with _errors(url, "delete"):
        r.fs.delete_file(r.path)


def check(url: str) -> None:
    """Fail early, naming the URL, when its bucket cannot be listed (missing, refused, unreachable)."""
    import pyarrow.fs as pafs

    r = remote(url)
    bucket = r.path.split("/")[0]
    with _errors(url, "open the bucket"):
        info = r.fs.get_file_info(bucket)
    if info.type == pafs.FileType.NotFound:
        raise StorageError(f"{url}: cannot open the bucket: the bucket does not exist: create it, or fix runs_dir")


# -- mirrors -----------------------------------------------------------------------------------
def _download(url: str, dest: Path, entry: Entry) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.part")
    try:
        tmp.write_bytes(get(url))
        os.utime(tmp, ns=(entry.mtime_ns, entry.mtime_ns))  # the object's time: pull skips it next time
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _matches(rel: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(rel, p) for p in patterns)


def _hidden(rel: str) -> bool:
    """Temp files and dirs (`.name.tmp`, `.adapter.tmp`, downloads in progress) never travel."""
    return any(part.startswith(".") for part in rel.split("/"))


def pull(directory: str | Path, include: Iterable[str] = ("*",)) -> int:
    """Bring the objects under a mirror dir's URL that match `include` (patterns on the relative
    name; `*` crosses `/`) into the mirror, skipping those it holds already or has written since
    (a resumed stage's own newer files); the count fetched."""
    url = url_of(directory)
    if url is None:
        return 0
    include = tuple(include)
    todo = []
    for rel, entry in listing(url).items():
        if _hidden(rel) or not _matches(rel, include):
            continue
        dest = Path(directory) / rel
        try:
            if dest.stat().st_mtime_ns >= entry.mtime_ns:
                continue  # the mirror's copy is this object (it carries its time) or newer: never clobbered
        except FileNotFoundError:
            pass
        todo.append((f"{url}/{rel}", dest, entry))
    _parallel(_download, todo)
    return len(todo)


def _parallel(fn, calls: list[tuple]) -> None:
    """fn(*args) for each, a few at a time (an object store's latency, not its bandwidth, is what
    a run's many small files pay); the first error is raised."""
    if len(calls) <= 1:
        for args in calls:
            fn(*args)
        return
    with ThreadPoolExecutor(min(TRANSFERS, len(calls))) as pool:
        for f in [pool.submit(fn, *args) for args in calls]:
            f.result()


def push_file(path: str | Path) -> bool:
    """Upload one file of a mirror (whole, in one upload); False for a plain local path."""
    url = url_of(path)
    if url is None:
        return False
    _upload(Path(path), url)
    return True


def _upload(path: Path, url: str) -> None:
    """put, then give the local file the object's time: `push` and `pull` skip what is equal."""
    put(url, path.read_bytes())
    r = remote(url)
    with _errors(url, "stat"):
        mtime = r.fs.get_file_info(r.path).mtime_ns
    if mtime:
        os.utime(path, ns=(mtime, mtime))


def push(directory: str | Path, last: Iterable[str] = (), exclude: Iterable[str] = (),
         delete_stale: bool = False) -> int:
    """Upload a mirror dir's files that are new or changed since their last upload, the `last`
    ones (relative names) after all others, so a reader that sees them sees the rest; with
    `delete_stale`, objects with no local file (a replaced convert, compacted shards) go before
    `last` does. Files matching `exclude` (and hidden ones) stay local. The count uploaded."""
    url = url_of(directory)
    if url is None:
        return 0
    root, exclude, last = Path(directory), tuple(exclude), tuple(last)
    there = listing(url)
    local = {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}
    local = {rel: p for rel, p in local.items() if not _hidden(rel) and not _matches(rel, exclude)}
    changed = [rel for rel, p in local.items() if _changed(p, there.get(rel))]
    _parallel(_upload, [(local[rel], f"{url}/{rel}") for rel in changed if rel not in last])
    if delete_stale:
        _delete_stale(url, there, local, exclude)
    for rel in last:  # in the order given, after everything else
        if rel in changed:
            _upload(local[rel], f"{url}/{rel}")
    return len(changed)


def _changed(path: Path, entry: Entry | None) -> bool:
    """Not uploaded yet, or written since its upload (`_upload` gives the file the object's time)."""
    st = path.stat()
    return entry is None or entry.size != st.st_size or st.st_mtime_ns > entry.mtime_ns


def _delete_stale(url: str, there: dict[str, Entry], local: dict[str, Path], exclude: tuple) -> None:
    _parallel(delete, [(f"{url}/{rel}",) for rel in there if rel not in local and not _matches(rel, exclude)])


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
