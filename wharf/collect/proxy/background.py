"""A RecordingProxy on its own event loop in a daemon thread: tests, or a runner in one process."""
from __future__ import annotations

import asyncio
import threading

from wharf.core.config import RunConfig
from .server import RecordingProxy


class BackgroundProxy:
    """A RecordingProxy on its own event loop in a daemon thread (tests, or a runner in one process).

    `with BackgroundProxy(cfg) as p: p.url, p.admin_url, p.admin_token`; stopping publishes every
    pending row.
    """

    def __init__(self, cfg: RunConfig):
        self.proxy = RecordingProxy(cfg)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="wharf-proxy")
        self.url = ""
        self.admin_url = ""
        self.admin_token = self.proxy.admin_token

    def call(self, coro, timeout: float | None = 60):
        """Run a coroutine on the proxy's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> "BackgroundProxy":
        self._thread.start()
        self.url = self.call(self.proxy.start())
        self.admin_url = self.proxy.admin_url
        return self

    def stop(self) -> None:
        try:
            self.call(self.proxy.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)

    def __enter__(self) -> "BackgroundProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
