"""The local engine's real HTTP server in a thread of the test process (for engines on tiny models,
where a child process's start would cost more than the test)."""
from __future__ import annotations

import asyncio
import threading
from contextlib import contextmanager
from typing import Iterator

from aiohttp import web

from wharf.engine.server import Engine, make_app


@contextmanager
def serve(engine: Engine) -> Iterator[str]:
    """Serve `engine` on a free port of 127.0.0.1 until the block ends; yields its base URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(make_app(engine), access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
