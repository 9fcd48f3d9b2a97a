"""Objects in a bucket, as wharf/core/storage.py's mirrors move them: the file system of a URL (S3 from
the usual AWS variables, else whatever pyarrow or fsspec opens), listing, HEAD (size and ETag),
whole-object put/get, delete, and errors that name the URL and what to check."""
from __future__ import annotations

import contextlib
import functools
import os
import re
from dataclasses import dataclass
from typing import Iterator
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from wharf.core.errors import WharfError

if TYPE_CHECKING:  # pyarrow loads when a URL is used: a local run (and layout's importers) never pays for it
    import pyarrow.fs as pafs


class StorageError(WharfError, OSError):
    """A bucket that cannot be reached, read or written; the message names the URL and what to check."""


# -- file systems ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Remote:
    url: str  # scheme://bucket/key
    fs: pafs.FileSystem
    path: str  # bucket/key, as `fs` names it


def split_url(url: str) -> tuple[str, str, str]:
    """scheme://bucket/key as (scheme, bucket, key). Not urlsplit: an object key is not a URL path,
    and a `#` or `?` in it (a run or file name) is part of the key, not a fragment or a query."""
    scheme, sep, rest = str(url).partition("://")
    if not sep:
        raise StorageError(f"{url}: not a storage URL (scheme://bucket/prefix)")
    bucket, _, key = rest.partition("/")
    return scheme, bucket, key.strip("/")


def remote(url: str) -> Remote:
    scheme, bucket, key = split_url(url)
    return Remote(url.rstrip("/"), _filesystem(scheme, _s3_env() if scheme == "s3" else ()), f"{bucket}/{key}".rstrip("/"))


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


def s3_endpoint() -> str | None:
    """The S3-compatible server (a MinIO, SeaweedFS) the usual AWS variables name, with a scheme
    (https:// when the variable has none); None: AWS itself. Every S3 client of wharf's asks here."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return (endpoint if "://" in endpoint else f"https://{endpoint}") if endpoint else None


def s3_region() -> str | None:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def s3_filesystem(**extra) -> pafs.S3FileSystem:
    """S3 from the usual AWS variables. pyarrow reads the credentials and region itself; the
    endpoint (a MinIO, SeaweedFS or other S3-compatible server) is passed on explicitly."""
    import pyarrow.fs as pafs

    kw: dict = {}
    endpoint = s3_endpoint()
    if endpoint:
        u = urlsplit(endpoint)
        kw.update(endpoint_override=u.netloc, scheme=u.scheme)
    region = s3_region()
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
    (re.compile(r"curlCode|Couldn't connect|Could not connect|connection refused|NETWORK_CONNECTION|Could not resolve", re.I),
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
        raise storage_error(url, doing, e) from None


def storage_error(url: str, doing: str, error: BaseException) -> StorageError:
    """One line: the URL, what failed, what to check, and the first line of the client's own error."""
    text = str(error)
    hint = next((h for pattern, h in _HINTS if pattern.search(text)), "see the error")
    return StorageError(f"{url}: cannot {doing}: {hint} ({text.strip().splitlines()[0][:300]})")


# -- objects -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    size: int
    mtime_ns: int  # whole seconds on S3: never enough to tell two versions of an object apart
    etag: str | None = None  # S3's ETag (the MD5 of an object uploaded in one PUT); None where unknown


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


def head(url: str) -> Entry:
    """One object's size and ETag (S3 answers both to one HEAD; a listing through pyarrow has no ETag)."""
    r = remote(url)
    with _errors(url, "stat"):
        with r.fs.open_input_file(r.path) as f:
            size, etag = f.size(), _etag(f.metadata())
        mtime = 0 if etag else (r.fs.get_file_info(r.path).mtime_ns or 0)
    return Entry(size, mtime, etag)


def _etag(metadata) -> str | None:
    value = dict(metadata or {}).get(b"ETag") or dict(metadata or {}).get("ETag")
    return (value.decode() if isinstance(value, bytes) else value or "").strip('"') or None


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
