"""The recording proxy as a child process of the round, and a client of its admin API."""
from __future__ import annotations

import contextlib
import dataclasses
import socket
from pathlib import Path
from typing import Iterator

import aiohttp

from wharf.core import procs
from wharf.core.config import RunConfig
from wharf.core.credentials import AdminAccess, new_token
from wharf.core.layout import admin_file, wal_dir
from wharf.core.endpoint import Endpoint
from wharf.collect.records import ClosedRollout, OpenedRollout, RecordError
from wharf.core.errors import WharfError


class ServiceError(WharfError, RuntimeError):
    """A service that would not start or answer."""


@contextlib.contextmanager
def proxy_process(cfg: RunConfig, config_path: Path, turns_dir: Path, log_path: Path) -> Iterator[AdminAccess]:
    """Run `python -m wharf.collect.proxy` writing its shards to `turns_dir` for the life of the block,
    and yield where its admin API is and its token. Its config (cfg with proxy.out_dir and, unless
    one is configured, a fresh admin token) goes to the child privately (procs.stage_argv), its record without secrets to `config_path`."""
    token = cfg.proxy.admin_token or new_token()
    proxy = dataclasses.replace(cfg.proxy, out_dir=str(turns_dir), admin_token=token)
    cfg = dataclasses.replace(cfg, proxy=proxy)
    access_path = admin_file(Path(proxy.wal_dir) if proxy.wal_dir else wal_dir(turns_dir))
    access_path.unlink(missing_ok=True)  # a killed proxy's file must not be taken for this one's
    if proxy.port and _listening(proxy.host, proxy.port):  # its /health would pass for ours
        raise ServiceError(f"proxy.port={proxy.port}: something already listens on {proxy.host}:{proxy.port} "
                           "(another run's proxy?); give this run a free port: proxy.port=<port>")
    proc = procs.spawn(procs.stage_argv("wharf.collect.proxy", cfg, config_path), log_path)
    try:
        Endpoint(f"http://{proxy.host}:{proxy.port}").wait_healthy(60, proc, log_path)
        try:  # written before the agents' listener answers /health
            access = AdminAccess.load(access_path)
        except ValueError as e:
            raise ServiceError(f"the proxy is up but {e}") from None
        if access.token != token:
            raise ServiceError(f"{access_path} holds another proxy's token: is a second proxy writing to {turns_dir}?")
        yield access
    finally:
        procs.stop(proc)


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2.0)
        return s.connect_ex((host if host != "0.0.0.0" else "127.0.0.1", port)) == 0


class ProxyAdmin:
    """Client of the proxy's admin API (its own listener, `url`): open and close rollouts."""

    def __init__(self, url: str, token: str):
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "ProxyAdmin":
        self._session = aiohttp.ClientSession(headers=self._headers, timeout=aiohttp.ClientTimeout(total=120))
        return self

    async def __aexit__(self, *exc) -> None:
        await self._session.close()

    async def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        async with self._session.request(method, self.url + path, json=body) as r:
            if r.status >= 400:
                raise ServiceError(f"proxy {method} {path}: HTTP {r.status}: {await r.text()}")
            return await r.json()

    async def open(self, rollout_id: str, policy: str, seed: int | None = None) -> OpenedRollout:
        path = "/admin/rollouts"
        body = await self._call("POST", path, {"rollout_id": rollout_id, "policy": policy, "seed": seed})
        return _record(OpenedRollout, body, path)

    async def close(self, rollout_id: str) -> ClosedRollout:
        path = f"/admin/rollouts/{rollout_id}/close"
        return _record(ClosedRollout, await self._call("POST", path), path)

    async def flush(self) -> dict:
        return await self._call("POST", "/admin/flush")


def _record(cls, body, path: str):
    try:
        return cls.from_json(body, f"proxy POST {path}")
    except RecordError as e:
        raise ServiceError(str(e)) from None
