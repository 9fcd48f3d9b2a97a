"""Binding an aiohttp app to a TCP address: the proxy's two listeners (agents', admin) alike."""
from __future__ import annotations

from aiohttp import web


async def bind(app: web.Application, host: str, port: int, backlog: int = 128) -> tuple[web.AppRunner, str]:
    """Serve `app` on host:port (port 0: any free one); returns its runner and base URL, with the
    port actually bound and a wildcard bind (0.0.0.0, ::) reached on loopback."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=backlog)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]
    return runner, f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{bound}"
