"""Host side of a sandbox's model route: a Unix socket that pipes to one TCP address.

The socket is bound into the sandbox, where the init forwards loopback connections to it
(init.py). Nothing but this one address is reachable through it.
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path
from urllib.parse import urlsplit


def parse_forward(spec: str) -> tuple[str, int]:
    """'http://127.0.0.1:8200/...' or '127.0.0.1:8200' -> (host, port); the host must be loopback,
    since the agent inside uses the same URL and the sandbox has only its own loopback."""
    url = urlsplit(spec if "//" in spec else f"tcp://{spec}")
    if url.port is None or url.hostname is None:
        raise ValueError(f"forward {spec!r}: expected HOST:PORT or a URL with a port")
    if url.hostname not in ("127.0.0.1", "localhost"):
        raise ValueError(f"forward {spec!r}: only loopback addresses can be forwarded into the sandbox")
    return "127.0.0.1", url.port


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


class Relay:
    """A Unix socket at `path` relaying each connection to TCP host:port."""

    def __init__(self, path: Path, host: str, port: int):
        self.path, self.host, self.port = path, host, port
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.path))
        os.chmod(self.path, 0o600)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self.path.unlink(missing_ok=True)
