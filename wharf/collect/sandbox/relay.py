"""Host side of a sandbox's model route: a Unix socket that passes one rollout's HTTP calls.

The socket is bound into the sandbox, where the init forwards loopback connections to it
(init.py). Nothing but this one address is reachable through it, and, when the forward names
a route (http://127.0.0.1:8200/rollout/<id>/v1), only requests under that route pass: not the
proxy's admin API, its metrics, or another rollout's route. Each connection carries one
request (Connection: close), framed here by Content-Length or chunked encoding, so nothing
after it reaches the proxy unchecked.
"""
from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

MAX_HEAD = 64 * 1024
# ':' for Gemini's `models/<model>:generateContent`; nothing that could escape the route.
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._~/:-]*(\?[^#\s]*)?$")
_FORBIDDEN = b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"


def parse_forward(spec: str) -> tuple[str, int, str]:
    """'http://127.0.0.1:8200/rollout/ID/v1' or '127.0.0.1:8200' -> (host, port, route prefix:
    '/rollout/ID/', or '' for any path); the host must be loopback, since the agent inside uses
    the same URL and the sandbox has only its own loopback."""
    url = urlsplit(spec if "//" in spec else f"tcp://{spec}")
    if url.port is None or url.hostname is None:
        raise ValueError(f"forward {spec!r}: expected HOST:PORT or a URL with a port")
    if url.hostname not in ("127.0.0.1", "localhost"):
        raise ValueError(f"forward {spec!r}: only loopback addresses can be forwarded into the sandbox")
    path = url.path.rstrip("/").removesuffix("/v1")
    return "127.0.0.1", url.port, f"{path}/" if path else ""


def allowed(target: str, prefix: str) -> bool:
    """An origin-form request target under the route: no dot segments, no escapes."""
    if not _SAFE_PATH.match(target):
        return False
    path = target.split("?", 1)[0]
    if any(seg in (".", "..") for seg in path.split("/")):
        return False
    return path.startswith(prefix) if prefix else True


def parse_head(head: bytes) -> tuple[str, str, list[tuple[str, str]]] | None:
    """(method, target, headers) of a request head, None when malformed."""
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
    except ValueError:
        return None
    if not version.startswith("HTTP/1.") or method == "CONNECT":
        return None
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or name != name.strip() or not name:
            return None
        headers.append((name, value.strip()))
    return method, target, headers


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except (ConnectionError, OSError, RuntimeError):
            pass


async def _copy_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, headers: dict[str, str]) -> None:
    """Pass exactly one request body, framed as its headers say."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";")[0].strip(), 16)
            writer.write(line)
            if size == 0:
                while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                    writer.write(trailer)
                writer.write(b"\r\n")
                return
            writer.write(await reader.readexactly(size + 2))
    else:
        left = int(headers.get("content-length", "0"))
        while left > 0:
            chunk = await reader.read(min(left, 65536))
            if not chunk:
                raise ConnectionError("request body cut short")
            writer.write(chunk)
            left -= len(chunk)
            await writer.drain()


def _refuse(writer: asyncio.StreamWriter, why: str) -> None:
    body = f"refused by the sandbox: {why}\n".encode()
    writer.write(_FORBIDDEN % (len(body), body))
    writer.close()


class Relay:
    """A Unix socket at `path` relaying one request per connection to TCP host:port, when its
    path is under `prefix` ('' lets any path through)."""

    def __init__(self, path: Path, host: str, port: int, prefix: str = ""):
        self.path, self.host, self.port, self.prefix = path, host, port, prefix
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.path), limit=MAX_HEAD)
        os.chmod(self.path, 0o600)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        parsed = parse_head(head[:-4])
        if parsed is None:
            return _refuse(writer, "not an HTTP/1.x request")
        method, target, headers = parsed
        fields = {k.lower(): v for k, v in headers}
        names = [k.lower() for k, _ in headers]
        if not allowed(target, self.prefix):
            return _refuse(writer, f"{target[:200]} is not this rollout's route")
        if names.count("content-length") > 1 or ("content-length" in fields and "transfer-encoding" in fields) \
                or not fields.get("content-length", "0").isdigit() or "upgrade" in fields:
            return _refuse(writer, "ambiguous request framing")
        try:
            up_r, up_w = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return
        keep = [(k, v) for k, v in headers if k.lower() not in ("connection", "keep-alive", "proxy-connection")]
        up_w.write(f"{method} {target} HTTP/1.1\r\n".encode("latin-1"))
        up_w.write("".join(f"{k}: {v}\r\n" for k, v in keep).encode("latin-1") + b"Connection: close\r\n\r\n")
        try:
            await _copy_body(reader, up_w, fields)
            await up_w.drain()
        except (ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            up_w.close()
            return _refuse(writer, "bad request body")
        await _pipe(up_r, writer)
        up_w.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self.path.unlink(missing_ok=True)
