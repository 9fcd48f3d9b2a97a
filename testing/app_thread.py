"""An aiohttp app served on its own event loop in a daemon thread, for tests: `url` once started."""
from __future__ import annotations

import asyncio
import threading
from typing import Callable

from aiohttp import web


class AppThread:
    def __init__(self, make_app: Callable[[], web.Application], port: int = 0, name: str = "app"):
        self.make_app, self.port, self.name = make_app, port, name
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    def start(self):
        ready = threading.Event()

        async def boot():
            self._runner = web.AppRunner(self.make_app(), access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", self.port)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]
            self.url = f"http://127.0.0.1:{self.port}"
            ready.set()

        def run():
            self._loop.run_until_complete(boot())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True, name=self.name)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError(f"{self.name} did not start within 10 s")
        return self

    def stop(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            return

        async def down():
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(down(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
