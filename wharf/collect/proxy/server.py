"""The recording proxy: OpenAI chat completions in, vLLM with token ids out, every call a `turns` row.

Agents reach it at /rollout/<id>/v1 (or plain /v1), either way with their rollout's API key;
the collect runner opens and closes rollouts through /admin, on a listener of its own. Each
call is forwarded with the recording parameters forced (return_token_ids, logprobs, the
configured temperature/top_p), its row is in the write-ahead log before the agent gets its
answer, and shards are published in the background (wharf/collect/proxy/shards.py).

This module assembles the app and reads the agent's calls. The rest has a module each: the
upstream call (forward.py), the event stream (sse.py), record-then-answer (recorder.py), the
rollout registry (rollouts.py), and the /admin, /health and /metrics routes (admin.py).
"""
from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import aiohttp
from aiohttp import web

from wharf.core.config import RunConfig
from wharf.core.credentials import AdminAccess, new_token
from wharf.core import storage
from wharf.core.layout import admin_file, registry_file, wal_dir
from wharf.collect.proxy import jsonx
from wharf.collect.proxy.admin import AdminAPI
from wharf.collect.proxy.capture import CaptureError, StreamRelay, capture_full, capture_text, plain_full
from wharf.collect.proxy.dialects import DialectError
from wharf.collect.proxy.dialects import anthropic as anthropic_dialect
from wharf.collect.proxy.dialects import gemini as gemini_dialect
from wharf.collect.proxy.dialects import responses as responses_dialect
from wharf.collect.proxy.errors import Reject, UpstreamFailure, reject_response
from wharf.collect.proxy.forward import Forwarder, forced_request, requested_max_tokens
from wharf.collect.proxy.listen import bind
from wharf.collect.proxy.metrics import Metrics
from wharf.collect.proxy.recorder import FullReply, Recorder, StreamReply
from wharf.collect.proxy.rollouts import Rollout, RolloutRegistry
from wharf.collect.proxy.shards import TurnStore
from wharf.collect.proxy.sse import chunk_batches
from wharf.collect.proxy.upstreams import UpstreamPool
from wharf.collect.records import TurnRow

_dumps = jsonx.dumps
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


class RecordingProxy:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        p = cfg.proxy
        # out_dir may be a URL (s3://...): shards go to its local mirror and each is uploaded whole.
        self.out_dir = storage.local_path(p.out_dir) if p.out_dir else cfg.round_layout.collect.turns
        self.wal_dir = Path(p.wal_dir) if p.wal_dir else wal_dir(self.out_dir)
        self.metrics = Metrics()
        self.store = TurnStore(self.out_dir, self.wal_dir, p.shard_rows, p.shard_bytes, p.shard_seconds, p.wal_fsync,
                               on_sync=self._synced)
        self.rollouts = RolloutRegistry(registry_file(self.wal_dir))
        self.pool = UpstreamPool([cfg.endpoint.url, *p.upstreams], p.health_interval_s, p.refused, self._policy_of)
        self.admin_token = p.admin_token or new_token()  # never a fixed default
        self.admin = AdminAPI(cfg, self.rollouts, self.store, self.pool, self.metrics, self.public_base,
                              self.admin_token)
        self.admin_url = ""
        self.forward = Forwarder(cfg, self.pool)
        self.recorder = Recorder(self.store, self.metrics)
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.recovery: dict = {}

    def _policy_of(self, rollout_id: str) -> str | None:
        rollout = self.rollouts.get(rollout_id)
        return rollout.policy if rollout else None

    def _synced(self, n: int) -> None:
        self.metrics.inc("wal_fsyncs_total", help="Group fsyncs of the WAL (each covers every call then in flight)")
        self.metrics.inc("wal_fsynced_records_total", n, help="WAL records made durable by those fsyncs")

    @property
    def session(self) -> aiohttp.ClientSession | None:
        return self.forward.session

    # -- life cycle ---------------------------------------------------------------------------
    async def start(self) -> str:
        """Recover left-overs, bind, and return the base URL (http://host:port)."""
        self.recovery = self.store.recover()
        # After recovery: the WAL's last turns say where each rollout's turns resume.
        self.rollouts.load(self.store.last_turn, self.out_dir)
        self.store.start()
        # Large read buffer: a stream's first line carries every prompt id (MBs for long prompts).
        self.forward.session = aiohttp.ClientSession(
            # keepalive under uvicorn's 5 s, so a pooled connection is not reused as the server drops it.
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=3.0), read_bufsize=1 << 22,
            auto_decompress=True)
        self.pool.start(self.session)
        # The admin listener and its file come first: whoever sees the agents' listener healthy
        # finds admin.json already written.
        self.admin_url = await self.admin.start(self.cfg.proxy.admin_host, self.cfg.proxy.admin_port)
        AdminAccess(self.admin_url, self.admin_token, os.getpid()).save(admin_file(self.wal_dir))
        app = web.Application(client_max_size=self.cfg.proxy.max_body_bytes)
        self._routes(app)
        self.runner, self.url = await bind(app, self.cfg.proxy.host, self.cfg.proxy.port, backlog=1024)
        return self.url

    async def stop(self) -> None:
        """Stop accepting, let calls finish, publish every pending row."""
        if self.runner:
            await self.runner.cleanup()
        await self.admin.stop()
        admin_file(self.wal_dir).unlink(missing_ok=True)
        self.pool.stop()
        if self.session:
            await self.session.close()
        await self.store.close()
        self.rollouts.shutdown()

    def public_base(self) -> str:
        return (self.cfg.proxy.public_url or self.url).rstrip("/")

    # -- routes -------------------------------------------------------------------------------
    def _routes(self, app: web.Application) -> None:
        r = app.router
        for root in ("/rollout/{rollout_id}/v1", "/v1"):
            r.add_post(root + "/chat/completions", self.chat)
            r.add_get(root + "/models", self.models)
            r.add_post(root + "/messages", self.messages)
            r.add_post(root + "/messages/count_tokens", self.count_tokens)
            r.add_post(root + "/responses", self.responses)
            r.add_post(root + "/models/{target}", self.gemini)  # Gemini (the Python SDK's default version)
            r.add_post(root + "beta/models/{target}", self.gemini)  # v1beta: gemini-cli's (the JS SDK's)
        self.admin.add_public_routes(r)

    async def models(self, request: web.Request) -> web.Response:
        try:
            r = self.rollouts.for_request(request)
        except Reject as e:
            return reject_response(self.metrics, e)
        return web.json_response({"object": "list", "data": [
            {"id": r.policy, "object": "model", "created": 0, "owned_by": "wharf"}]})

    async def messages(self, request: web.Request) -> web.StreamResponse:
        return await self.chat(request, anthropic_dialect)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self.chat(request, responses_dialect)

    async def gemini(self, request: web.Request) -> web.StreamResponse:
        """Gemini's models/{model}:{method}: generateContent, streamGenerateContent, countTokens."""
        model, _, method = request.match_info["target"].rpartition(":")
        dialect = gemini_dialect.Call(model, method == "streamGenerateContent")
        if method == "countTokens":
            return await self.count_tokens(request, dialect)
        if method == "streamGenerateContent" and request.query.get("alt") != "sse":
            return reject_response(self.metrics, Reject(400, "streamGenerateContent is served as server-sent "
                                                        "events only: add ?alt=sse", "bad_request"), dialect)
        if method not in ("generateContent", "streamGenerateContent"):
            return reject_response(self.metrics, Reject(404, f"method {method!r} is not served: generateContent, "
                                                        "streamGenerateContent or countTokens", "not_found"), dialect)
        return await self.chat(request, dialect)

    async def count_tokens(self, request: web.Request, dialect=anthropic_dialect) -> web.Response:
        """claude-code's /v1/messages/count_tokens, Gemini's :countTokens: the prompt length from the
        upstream's /tokenize, else a 4-characters-a-token estimate. Not a turn."""
        try:
            rollout = self.rollouts.for_request(request)
            try:
                chat = dialect.count_chat(_json_body(await request.read()))
            except DialectError as e:
                raise Reject(400, str(e), "bad_request") from None
        except Reject as e:
            return reject_response(self.metrics, e, dialect)
        body = {"model": rollout.policy, "messages": chat["messages"], "add_generation_prompt": True}
        if chat.get("tools"):
            body["tools"] = chat["tools"]
        n = await self.forward.count_tokens(rollout.rollout_id, body)
        if n is None:
            n = len(_dumps([chat["messages"], chat.get("tools")])) // 4
        return web.json_response(dialect.count_answer(n))

    # -- the recorded call --------------------------------------------------------------------
    async def _read_call(self, request: web.Request, dialect) -> tuple[Rollout, bytes, dict, dict]:
        """The rollout, raw body, request and its chat form; Reject when the call cannot be taken."""
        rollout = self.rollouts.for_request(request)
        limit = self.cfg.proxy.max_body_bytes
        too_large = Reject(413, f"request body over proxy.max_body_bytes={limit} bytes", "too_large")
        if request.content_length is not None and request.content_length > limit:
            raise too_large
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise too_large from None
        req = _json_body(raw)
        if dialect is not None:
            try:
                chat_req = dialect.to_chat(req)
            except DialectError as e:
                raise Reject(400, str(e), "bad_request") from None
        else:
            chat_req = req
            if not isinstance(req, dict) or not isinstance(req.get("messages"), list) or not req["messages"]:
                raise Reject(400, "request body must be a JSON object with a non-empty 'messages' list", "bad_request")
            if req.get("n") not in (None, 1):
                raise Reject(400, "n > 1 is not supported by the recording proxy (one completion per call)",
                             "bad_request")
        if rollout.state != "open":  # closed while the body was read: close has already published
            raise Reject(403, f"rollout '{rollout.rollout_id}' is closed", "closed_rollout", "permission_error")
        return rollout, raw, req, chat_req

    async def chat(self, request: web.Request, dialect=None) -> web.StreamResponse:
        """One recorded call; `dialect` (wharf/collect/proxy/dialects) translates a non-chat agent both ways."""
        started = time.time()
        t0 = time.perf_counter()
        try:
            rollout, raw, req, chat_req = await self._read_call(request, dialect)
        except Reject as e:
            return reject_response(self.metrics, e, dialect)
        cap = self.cfg.sampling.max_tokens
        room = await self.forward.context_room(rollout.rollout_id, chat_req, rollout.policy,
                                               requested_max_tokens(chat_req, cap))
        if rollout.state != "open":  # closed while the prompt was measured
            return reject_response(self.metrics, Reject(403, f"rollout '{rollout.rollout_id}' is closed",
                                                        "closed_rollout", "permission_error"), dialect)
        turn = rollout.next_turn
        rollout.next_turn += 1
        rollout.inflight += 1
        rollout.idle.clear()
        request_id = uuid.uuid4().hex
        text_only = self.cfg.proxy.text_only
        upstream, sampling = forced_request(chat_req, rollout, turn, cap, full=dialect is not None, room=room,
                                            text_only=text_only)
        row = TurnRow(rollout_id=rollout.rollout_id, turn=turn, request_id=request_id,
                      api=dialect.NAME if dialect is not None else "chat", policy=rollout.policy,
                      started_at=started, ended_at=None, request=raw.decode("utf-8", "replace"), response=None,
                      sampling=_dumps(sampling).decode(), text_only=text_only)
        headers = {"x-wharf-request-id": request_id, "x-wharf-turn": str(turn)}
        try:
            if chat_req.get("stream"):
                return await self._stream(request, req, rollout, upstream, row, headers, dialect)
            return await self._full(request, req, rollout, upstream, row, headers, dialect)
        finally:
            rollout.inflight -= 1
            if rollout.inflight == 0:
                rollout.idle.set()
            self.metrics.observe(time.perf_counter() - t0, policy=rollout.policy)

    async def _full(self, request: web.Request, req: dict, rollout: Rollout, upstream: bytes, row: TurnRow,
                    headers: dict, dialect=None) -> web.Response:
        try:
            data = await self.forward.complete(rollout.rollout_id, upstream)
            try:
                got = capture_text(data) if self.cfg.proxy.text_only else capture_full(data)
            except CaptureError as e:
                raise UpstreamFailure(502, f"upstream answer unusable for recording: {e}", "no_token_ids") from None
        except UpstreamFailure as fail:
            return await self.recorder.settle(rollout, row, fail, None, FullReply(b"", headers, dialect, request))
        if dialect is not None:
            out = _dumps(dialect.from_chat(data, req))
        else:
            out = _dumps(plain_full(data, req.get("model"), bool(req.get("logprobs"))))
        return await self.recorder.settle(rollout, row, got, out, FullReply(out, headers, dialect, request))

    async def _stream(self, request: web.Request, req: dict, rollout: Rollout, upstream: bytes, row: TurnRow,
                      headers: dict, dialect=None) -> web.StreamResponse:
        try:
            resp = await self.forward.open_stream(rollout.rollout_id, upstream)
        except UpstreamFailure as fail:
            return await self.recorder.settle(rollout, row, fail, None, FullReply(b"", headers, dialect, request))
        relay = StreamRelay(req, dialect.Stream(req) if dialect is not None else None, self.cfg.proxy.text_only)
        out = web.StreamResponse(headers={**headers, **_SSE_HEADERS})
        reply = StreamReply(out, relay.tr, dialect, request)
        response = None
        try:
            await out.prepare(request)
            async for chunks in chunk_batches(resp.content.iter_any()):
                data = relay.feed(chunks)
                if data:
                    await out.write(data)
            result, reply.tail, response = relay.finish()
        except CaptureError as e:
            result = UpstreamFailure(502, f"upstream stream unusable for recording: {e}", "no_token_ids")
        except UpstreamFailure as e:
            result = e
        except asyncio.TimeoutError:
            result = self.forward.timed_out()
        except ConnectionResetError as e:
            if reply.agent_gone():
                # The agent went away mid-stream; the call reached the endpoint, so it is recorded (abandoned).
                reply.dropped = True
                result = UpstreamFailure(499, f"agent disconnected mid-stream ({e})", "agent_disconnected")
            else:  # aiohttp's client reset error is a ConnectionResetError too: the upstream's
                result = UpstreamFailure(502, f"upstream stream broken off: {type(e).__name__}: {e}", "connection")
        except aiohttp.ClientError as e:
            result = UpstreamFailure(502, f"upstream stream broken off: {type(e).__name__}: {e}", "connection")
        finally:
            resp.close()  # also aborts generation upstream when we stop early
        return await self.recorder.settle(rollout, row, result, response, reply)


def _json_body(raw: bytes):
    try:
        return jsonx.loads(raw)
    except ValueError as e:
        raise Reject(400, f"request body is not valid JSON ({e})", "bad_json") from None
