"""The proxy's operator side: the /admin API the collect runner drives, and /health and /metrics.

/admin (bearer token: proxy.admin_token, else a random one per run) opens, inspects and closes
rollouts and flushes shards. It has a listener of its own (proxy.admin_host/admin_port, loopback
by default), so nothing that can reach the agents' listener reaches it there: that one answers 404
under /admin. /health and /metrics are open on both, for probes and Prometheus. None of it is on a
recorded call's path.
"""
from __future__ import annotations

import logging
import re
import secrets
from typing import Callable

from aiohttp import web

from wharf.core.config import RunConfig
from wharf.core.credentials import bearer, same
from wharf.collect.proxy.errors import Reject, reject_response
from wharf.collect.proxy.listen import bind
from wharf.collect.proxy.metrics import Metrics
from wharf.collect.proxy.rollouts import Rollout, RolloutRegistry
from wharf.collect.proxy.shards import TurnStore
from wharf.collect.proxy.upstreams import UpstreamPool
from wharf.collect.records import ClosedRollout, OpenedRollout, RolloutState

log = logging.getLogger("wharf.proxy.admin")

_ROLLOUT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class AdminAPI:
    def __init__(self, cfg: RunConfig, rollouts: RolloutRegistry, store: TurnStore, pool: UpstreamPool,
                 metrics: Metrics, public_base: Callable[[], str], token: str):
        self.cfg = cfg
        self.token = token
        self.rollouts = rollouts
        self.store = store
        self.pool = pool
        self.metrics = metrics
        # A callable: the proxy's URL is only known once it is bound.
        self.public_base = public_base
        self._runner: web.AppRunner | None = None

    # -- listeners ------------------------------------------------------------------------------
    def add_public_routes(self, router: web.UrlDispatcher) -> None:
        """The agents' listener: probes only; /admin is not served there."""
        router.add_get("/health", self.health)
        router.add_get("/metrics", self.get_metrics)
        router.add_route("*", "/admin{tail:.*}", self.not_here)

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/admin/rollouts", self.admin_open)
        router.add_post("/admin/rollouts/{rollout_id}/close", self.admin_close)
        router.add_get("/admin/rollouts/{rollout_id}", self.admin_get)
        router.add_post("/admin/flush", self.admin_flush)
        router.add_get("/health", self.health)
        router.add_get("/metrics", self.get_metrics)

    async def start(self, host: str, port: int) -> str:
        """Bind the admin listener; returns its base URL."""
        app = web.Application()
        self.add_routes(app.router)
        self._runner, url = await bind(app, host, port)
        return url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def not_here(self, request: web.Request) -> web.Response:
        return reject_response(self.metrics, Reject(404, "no admin API on this listener", "not_found",
                                                    "not_found_error"))

    def _admin(self, request: web.Request) -> None:
        if not same(bearer(request.headers), self.token):
            raise Reject(401, "admin API: missing or wrong bearer token (proxy.admin_token, else the token "
                              "in the proxy's _wal/admin.json)", "bad_admin_token", "authentication_error")

    def _open_answer(self, r: Rollout) -> dict:
        return OpenedRollout(r.rollout_id, f"{self.public_base()}/rollout/{r.rollout_id}/v1", r.api_key,
                             r.policy).to_json()

    async def admin_open(self, request: web.Request) -> web.Response:
        try:
            self._admin(request)
            try:
                body = await request.json() if request.can_read_body else {}
            except ValueError as e:
                raise Reject(400, f"POST /admin/rollouts: body is not valid JSON ({e})", "bad_json") from None
            if not isinstance(body, dict):
                raise Reject(400, "POST /admin/rollouts: body must be a JSON object", "bad_request")
            unknown = set(body) - {"rollout_id", "policy", "temperature", "top_p", "seed"}
            if unknown:
                raise Reject(400, f"POST /admin/rollouts: unknown fields {sorted(unknown)} "
                                  "(known: rollout_id, policy, temperature, top_p, seed)", "bad_request")
            rid = body.get("rollout_id") or secrets.token_hex(16)  # 128 random bits
            if not isinstance(rid, str) or not _ROLLOUT_ID.match(rid):
                raise Reject(400, f"rollout_id {rid!r}: use 1-128 characters of A-Z a-z 0-9 . _ : -", "bad_request")
            policy = body.get("policy") or self.cfg.endpoint.model
            if not isinstance(policy, str):
                raise Reject(400, f"policy {policy!r}: expected a model name", "bad_request")
            params = {}
            for k in ("temperature", "top_p"):
                v = body.get(k, getattr(self.cfg.sampling, k))
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise Reject(400, f"{k} {v!r}: expected a number", "bad_request")
                if v <= 0:  # greedy log-probs are of no distribution the trainer can recompute
                    raise Reject(400, f"{k} {v!r}: must be > 0", "bad_request")
                if k == "top_p" and v < 1 and not self.cfg.sampling.top_p_uncorrected:
                    raise Reject(400, f"top_p {v!r}: < 1 is a truncated distribution the trainer does not reproduce "
                                      "(the proxy's config sets no sampling.top_p_uncorrected)", "bad_request")
                params[k] = float(v)
            seed = body.get("seed")
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                raise Reject(400, f"seed {seed!r}: expected an integer or null", "bad_request")
        except Reject as e:
            return reject_response(self.metrics, e)
        existing = self.rollouts.get(rid)
        if existing is not None:
            if existing.state != "open":
                return reject_response(self.metrics, Reject(409, f"rollout '{rid}' is closed; open a new id",
                                                            "reopen_closed", "conflict_error"))
            return web.json_response(self._open_answer(existing), status=200)
        r = self.rollouts.open(rid, policy, params["temperature"], params["top_p"], seed)
        self.metrics.inc("rollouts_opened_total", help="Rollouts opened")
        return web.json_response(self._open_answer(r), status=201)

    def _admin_rollout(self, request: web.Request) -> Rollout:
        self._admin(request)
        rid = request.match_info["rollout_id"]
        r = self.rollouts.get(rid)
        if r is None:
            raise Reject(404, f"unknown rollout '{rid}'", "unknown_rollout", "not_found_error")
        return r

    async def admin_close(self, request: web.Request) -> web.Response:
        try:
            r = self._admin_rollout(request)
        except Reject as e:
            return reject_response(self.metrics, e)
        if self.rollouts.close(r):
            self.metrics.inc("rollouts_closed_total", help="Rollouts closed")
        # Calls already under way finish and are recorded (bounded by the upstream timeout).
        await r.idle.wait()
        try:
            await self.store.flush(r.rollout_id)
        except Exception as e:  # noqa: BLE001 - e.g. a bucket answering 503, expired credentials
            # The rows are durable in the WAL and stay pending: the next flush or close publishes
            # them, and a restarted proxy at start-up. The finished, scored rollout is not lost.
            log.warning("rollout %s closed; publishing its rows failed (%s): they stay in the WAL, retried on "
                        "the next flush", r.rollout_id, e)
        published = not self.store.has_pending(r.rollout_id)
        return web.json_response(ClosedRollout(r.rollout_id, r.n_turns, r.n_errors, published).to_json())

    async def admin_get(self, request: web.Request) -> web.Response:
        try:
            r = self._admin_rollout(request)
        except Reject as e:
            return reject_response(self.metrics, e)
        return web.json_response(RolloutState(r.rollout_id, r.state, r.n_turns, r.n_errors, r.policy,
                                              r.inflight).to_json())

    async def admin_flush(self, request: web.Request) -> web.Response:
        try:
            self._admin(request)
        except Reject as e:
            return reject_response(self.metrics, e)
        return web.json_response({"shards": await self.store.flush()})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "upstreams": self.pool.describe(),
                                  "open_rollouts": self.rollouts.n_open(),
                                  "pending_rows": len(self.store.pending)})

    async def get_metrics(self, request: web.Request) -> web.Response:
        gauges = {"pending_rows": len(self.store.pending), "published_rows_total": self.store.n_published,
                  "shard_write_errors_total": self.store.flush_errors,
                  "open_rollouts": self.rollouts.n_open(),
                  "upstreams_healthy": sum(u.healthy for u in self.pool.upstreams)}
        return web.Response(text=self.metrics.render(gauges), content_type="text/plain", charset="utf-8")
