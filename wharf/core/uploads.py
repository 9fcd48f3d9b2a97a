"""One file up as one object, all or nothing, and checked without taking the ETag for an MD5
(wharf/core/storage.py's push calls it).

- **A known length.** The file's length is taken when it is opened and exactly that many bytes go
  up (a file still growing, a log, goes up as far as it was then). Each request declares its
  length and its MD5, read from the file before it is sent: a read that fails, or a file that
  shrank or changed meanwhile, fails before the request or is refused by the server (a short
  body, a wrong digest), never committed.
- **Checked by the server as it lands.** On S3 each request (the one PUT, or each part of a
  multipart upload) carries the MD5 of its body in Content-MD5: the server refuses a body it did
  not receive intact (BadDigest). The object's ETag is then only an identity: the HEAD after the
  upload must answer the size sent and the ETag the upload's own answer gave. So a bucket with
  SSE-KMS or SSE-C, whose ETags are no MD5s, is checked like any other, and another writer's
  object in between is still told apart.
- **No upload left open.** A multipart upload that fails (a part, the completion, an exception
  here) is aborted: its parts are dropped, and nothing stays half-made in the bucket to be paid for.

Other schemes (gs://, fsspec's) stream through pyarrow as before, checked by size, and MD5 against
the ETag where the store gives one that is an MD5.
"""
from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import io
import os
from pathlib import Path
from typing import BinaryIO, Iterator

from wharf.core.objects import (Entry, StorageError, _errors, _s3_env, head, remote, s3_endpoint, s3_region,
                                split_url, storage_error)

MIN_PART = 5 << 20  # S3's smallest part but the last (EntityTooSmall otherwise)


def upload(path: Path, url: str, part_size: int) -> Entry:
    """Upload `path` to `url`; the object as the bucket then holds it (size and ETag)."""
    with open(path, "rb") as src:
        size = os.fstat(src.fileno()).st_size
        if url.startswith("s3://"):
            etag, md5 = _s3_upload(src, size, url, part_size), None
        else:
            etag, md5 = None, _stream_upload(src, size, url, part_size)
    obj = head(url)
    if obj.size != size or (etag and obj.etag and obj.etag != etag) or (
            md5 and obj.etag and "-" not in obj.etag and obj.etag != md5):
        raise StorageError(f"{url}: the object is not the one just uploaded from {path} (size {obj.size} against "
                           f"{size}, ETag {obj.etag} against {etag or md5}): another writer, or a damaged upload; "
                           "push again")
    return obj


def _read(src: BinaryIO, n: int) -> bytes:
    data = src.read(n)
    if len(data) != n:
        raise StorageError(f"{src.name}: {len(data)} bytes where {n} were expected: the file shrank while it was "
                           "uploaded (rewritten in place?); push again")
    return data


def _stream_upload(src: BinaryIO, size: int, url: str, part_size: int) -> str:
    md5, left = hashlib.md5(), size
    r = remote(url)
    with _errors(url, "write"):
        with r.fs.open_output_stream(r.path) as out:
            while left:
                chunk = _read(src, min(part_size, left))
                md5.update(chunk)
                out.write(chunk)
                left -= len(chunk)
    return md5.hexdigest()


# -- S3 -------------------------------------------------------------------------------------------
def s3_client():
    """wharf's S3 client (botocore) from the usual AWS variables: the uploads' and the run lease's."""
    return _client(_s3_env())


@functools.lru_cache(maxsize=8)
def _client(env: tuple):
    """`env` keys the cache: a change of an AWS variable is another client."""
    import botocore.session
    from botocore.config import Config

    endpoint, region = s3_endpoint(), s3_region()
    # Content-MD5 is the check asked for; the newer default checksums (aws-chunked trailers) are
    # not understood by every S3-compatible server.
    config = Config(s3={"addressing_style": "path"} if endpoint else {}, retries={"mode": "standard", "max_attempts": 3},
                    request_checksum_calculation="when_required", response_checksum_validation="when_required",
                    max_pool_connections=16)
    return botocore.session.get_session().create_client("s3", endpoint_url=endpoint, region_name=region, config=config)


@contextlib.contextmanager
def _s3_errors(url: str, doing: str) -> Iterator[None]:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (BotoCoreError, ClientError) as e:
        raise storage_error(url, doing, e) from None


class _Part(io.RawIOBase):
    """`length` bytes of a file from `offset`, as a request body: read in blocks (the part is never
    held whole in memory), and seekable (the client reads it once to sign it, then to send it)."""

    def __init__(self, src: BinaryIO, offset: int, length: int):
        super().__init__()
        self.src, self.fd, self.offset, self.length, self.pos = src, src.fileno(), offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = max(0, min(self.length, (0, self.pos, self.length)[whence] + pos))
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.length - self.pos if n is None or n < 0 else min(n, self.length - self.pos)
        data = os.pread(self.fd, n, self.offset + self.pos) if n else b""
        if len(data) != n:
            raise StorageError(f"{self.src.name}: shorter than when its upload began (rewritten in place?); push again")
        self.pos += n
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def md5(self) -> str:
        """Content-MD5 of the part (read once through; the position is left at the start)."""
        h = hashlib.md5()
        while block := self.read(1 << 20):
            h.update(block)
        self.seek(0)
        return base64.b64encode(h.digest()).decode()


def _s3_upload(src: BinaryIO, size: int, url: str, part_size: int) -> str:
    """The object's ETag, as the upload's answer gives it."""
    _, bucket, key = split_url(url)
    client, part_size = s3_client(), max(part_size, MIN_PART)
    if size <= part_size:
        body = _Part(src, 0, size)
        md5 = body.md5()
        with _s3_errors(url, "write"):
            answer = client.put_object(Bucket=bucket, Key=key, Body=body, ContentLength=size, ContentMD5=md5)
        return answer["ETag"].strip('"')
    with _s3_errors(url, "write"):
        upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    try:
        return _s3_parts(client, src, size, url, part_size, upload_id)
    except BaseException:
        with contextlib.suppress(Exception):  # the error that stopped it is the one to report
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        raise


def _s3_parts(client, src: BinaryIO, size: int, url: str, part_size: int, upload_id: str) -> str:
    _, bucket, key = split_url(url)
    parts = []
    for number, offset in enumerate(range(0, size, part_size), start=1):
        body = _Part(src, offset, min(part_size, size - offset))
        md5 = body.md5()
        with _s3_errors(url, f"write part {number}"):
            answer = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body,
                                        ContentLength=body.length, ContentMD5=md5)
        parts.append({"ETag": answer["ETag"], "PartNumber": number})
    with _s3_errors(url, "complete the upload"):
        answer = client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                                  MultipartUpload={"Parts": parts})
    return answer["ETag"].strip('"')
