"""Upstream endpoints: sticky routing by rollout id, health checks, failover.

Sticky routing keeps a rollout's calls on one endpoint so its growing prompt hits that
endpoint's prefix cache. Rendezvous hashing picks the endpoint: when one goes down only its
rollouts move, and they come back when it recovers.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Callable

import aiohttp

log = logging.getLogger("wharf.proxy.upstreams")


class Upstream:
    def __init__(self, url: str):
        self.url = url.rstrip("/")
        # An OpenAI-style base may end in /v1; the chat route is appended below it.
        self.base = self.url[:-3] if self.url.endswith("/v1") else self.url
        self.chat_url = self.base + "/v1/chat/completions"
        self.healthy = True
        self.last_error = ""
        self.checked_at = 0.0

    def mark_down(self, why: str) -> None:
        if self.healthy:
            log.warning("upstream %s marked down: %s", self.url, why)
        self.healthy = False
        self.last_error = why

    def __repr__(self) -> str:
        return f"Upstream({self.url}, healthy={self.healthy})"


class UpstreamPool:
    def __init__(self, urls: list[str], health_interval_s: float = 5.0,
                 refused: dict[str, list[str]] | None = None, policy_of: Callable[[str], str | None] | None = None):
        """`refused`: {policy: upstream urls that refused to load it}, never routed its calls;
        `policy_of`: a rollout id's policy."""
        seen, ups = set(), []
        for u in urls:
            if u and u.rstrip("/") not in seen:
                seen.add(u.rstrip("/"))
                ups.append(Upstream(u))
        if not ups:
            raise ValueError("no upstream: set endpoint.url (and optionally proxy.upstreams)")
        self.upstreams = ups
        self.refused = {policy: {u.rstrip("/") for u in urls} for policy, urls in (refused or {}).items()}
        self.policy_of = policy_of
        self.health_interval_s = health_interval_s
        self._task: asyncio.Task | None = None

    def _score(self, up: Upstream, key: str) -> int:
        return int.from_bytes(hashlib.blake2b(f"{up.url}|{key}".encode(), digest_size=8).digest(), "big")

    def refuse(self, rollout_id: str, up: Upstream, why: str) -> bool:
        """`up` does not serve the rollout's policy (e.g. a replica restarted and forgot its runtime
        LoRAs): none of the policy's calls go there from now on. False when the policy is unknown."""
        policy = self.policy_of(rollout_id) if self.policy_of is not None else None
        if not policy:
            return False
        if up.url not in self.refused.setdefault(policy, set()):
            log.error("upstream %s does not serve %s (%s): its calls go to the other upstreams", up.url, policy, why)
        self.refused[policy].add(up.url)
        return True

    def order(self, rollout_id: str) -> list[Upstream]:
        """Upstreams to try for this rollout: its sticky choice first, healthy ones before unhealthy;
        none that refused the rollout's policy."""
        ups = self.upstreams
        if self.refused and self.policy_of is not None:
            skip = self.refused.get(self.policy_of(rollout_id) or "", set())
            ups = [u for u in ups if u.url not in skip]
        if len(ups) <= 1:
            return ups
        ranked = sorted(ups, key=lambda u: self._score(u, rollout_id), reverse=True)
        return [u for u in ranked if u.healthy] + [u for u in ranked if not u.healthy]

    async def check(self, session: aiohttp.ClientSession) -> None:
        async def one(up: Upstream) -> None:
            try:
                async with session.get(up.base + "/health", timeout=aiohttp.ClientTimeout(total=5)) as r:
                    ok = r.status == 200
                    why = f"/health answered {r.status}"
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                ok, why = False, f"/health failed: {type(e).__name__}: {e}"
            up.checked_at = time.time()
            if ok:
                if not up.healthy:
                    log.warning("upstream %s is back", up.url)
                up.healthy = True
            else:
                up.mark_down(why)

        await asyncio.gather(*(one(u) for u in self.upstreams))

    def start(self, session: aiohttp.ClientSession) -> None:
        if self.health_interval_s > 0:
            self._task = asyncio.get_running_loop().create_task(self._loop(session))

    async def _loop(self, session: aiohttp.ClientSession) -> None:
        while True:
            try:
                await self.check(session)
            except Exception:  # noqa: BLE001 - a health check must never kill the proxy
                log.exception("health check failed")
            await asyncio.sleep(self.health_interval_s)

    def stop(self) -> None:
        if self._task:
            self._task.cancel()

    def describe(self) -> list[dict]:
        return [{"url": u.url, "healthy": u.healthy, "last_error": u.last_error,
                 "refused": sorted(p for p, urls in self.refused.items() if u.url in urls)} for u in self.upstreams]
