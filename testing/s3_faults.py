"""A tiny HTTP proxy in front of an S3 server that answers 503 (S3's SlowDown) on demand: fault
injection for tests of what a failing bucket costs. Requests are relayed as they came (the
signature covers the Host header, which is relayed unchanged), so the server checks them as usual.

    with FaultyS3(upstream="http://127.0.0.1:8333") as proxy:
        os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
        proxy.fail = lambda method, path: method == "PUT"   # every upload answers 503 from now on
        proxy.fail = None                                    # the bucket is back
        proxy.etags = sse_etag                               # ETags as a bucket with SSE-KMS/SSE-C gives them

`etags` rewrites each object's ETag wherever the client sees it (the ETag header of a PUT, HEAD
or GET answer, and <ETag> in the XML of a completed multipart upload or a listing) into another
32 hex digits that are not the content's MD5, as an SSE bucket's are. A part's ETag is left as it
is: the client sends those back to complete the upload, and the server checks them.
"""
from __future__ import annotations

import hashlib
import http.client
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import urlsplit

_SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
              b"<Message>injected by testing/s3_faults.py</Message></Error>")
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"}


def sse_etag(etag: str) -> str:
    """What an SSE-KMS bucket answers instead of the MD5: opaque, 32 hex digits, the same each time."""
    return hashlib.md5(f"sse-kms:{etag}".encode()).hexdigest()


_XML_ETAG = re.compile(rb"<ETag>(&#34;|&quot;|\")?([^<&\"]+)(&#34;|&quot;|\")?</ETag>")


def _rewrite_etags(rule, path: str, headers: list, data: bytes) -> tuple[list, bytes]:
    if "partNumber=" in path:
        return headers, data
    headers = [(k, f'"{rule(v.strip(chr(34)))}"' if k.lower() == "etag" else v) for k, v in headers]
    if "xml" not in dict((k.lower(), v) for k, v in headers).get("content-type", ""):
        return headers, data  # an object's own bytes are never touched
    data = _XML_ETAG.sub(lambda m: b"<ETag>" + (m.group(1) or b"") + rule(m.group(2).decode()).encode()
                         + (m.group(3) or b"") + b"</ETag>", data)
    return headers, data


class _Relay(BaseHTTPRequestHandler):
    """Each request: recorded, delayed, answered 503 when the owner's rule says so, else relayed."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def _relay(self):
        owner: FaultyS3 = self.server.owner
        body = self._body()
        owner.seen.append((self.command, self.path))
        if owner.delay_s:
            time.sleep(owner.delay_s)
        rule = owner.fail
        if rule is not None and rule(self.command, self.path):
            owner.failed.append((self.command, self.path))
            self._send(503, "Slow Down", [("Content-Type", "application/xml")], _SLOW_DOWN, len(_SLOW_DOWN))
            return
        conn = http.client.HTTPConnection(*owner.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            kept = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP and k.lower() != "content-length"]
            if owner.etags is not None:
                kept, data = _rewrite_etags(owner.etags, self.path, kept, data)
            self._send(resp.status, resp.reason, kept, data, resp.getheader("Content-Length") or 0)
        finally:
            conn.close()

    def _send(self, status: int, reason: str, headers: list, data: bytes, head_length) -> None:
        """A HEAD answer carries the length a GET would have, and no body."""
        self.send_response(status, reason)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(head_length if self.command == "HEAD" else len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _body(self) -> bytes:
        """The request's body, HTTP chunked framing undone (the relay sends a Content-Length)."""
        if "chunked" not in (self.headers.get("Transfer-Encoding") or "").lower():
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""
        parts = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay


class FaultyS3:
    def __init__(self, upstream: str):
        u = urlsplit(upstream)
        self.upstream = (u.hostname, u.port)
        self.fail: Callable[[str, str], bool] | None = None  # (method, path) -> answer 503
        self.failed: list[tuple[str, str]] = []  # the requests answered 503
        self.seen: list[tuple[str, str]] = []  # every request, in order
        self.etags: Callable[[str], str] | None = None  # rewrites every object's ETag the client sees
        self.delay_s = 0.0  # each request waits this long first: a slow bucket
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Relay)
        self.server.owner = self
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "FaultyS3":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def main(argv: list[str] | None = None) -> None:
    """`python -m testing.s3_faults UPSTREAM FILE PART...`: a relay to UPSTREAM whose every PUT to a
    path holding each PART answers 503, until killed; its endpoint goes into FILE once it listens.
    The live Ray cluster test gives one worker this endpoint: that node's shard uploads of one run fail."""
    import argparse
    import os

    p = argparse.ArgumentParser(prog="python -m testing.s3_faults")
    p.add_argument("upstream")
    p.add_argument("endpoint_file")
    p.add_argument("parts", nargs="+")
    args = p.parse_args(argv)
    with FaultyS3(args.upstream) as proxy:
        proxy.fail = lambda method, path: method == "PUT" and all(part in path for part in args.parts)
        tmp = args.endpoint_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(proxy.endpoint)
        os.replace(tmp, args.endpoint_file)
        threading.Event().wait()  # until killed (the test's pid namespace ends with it)


if __name__ == "__main__":
    main()
