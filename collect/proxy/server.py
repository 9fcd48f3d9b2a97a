"""The recording proxy: OpenAI chat completions in, vLLM with token ids out, every call a `turns` row.

Agents reach it at /rollout/<id>/v1 (or plain /v1 with a per-rollout API key); the collect
runner opens and closes rollouts through /admin. Each call is forwarded with the recording
parameters forced (return_token_ids, logprobs, the configured temperature/top_p), its row is
in the write-ahead log before the agent gets its answer, and shards are published in the
background (collect/proxy/shards.py).
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import os
import re
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pyarrow.parquet as pq
from aiohttp import web

from collect.config import RunConfig
from collect.proxy import jsonx
from collect.proxy.capture import CaptureError, StreamCapture, capture_full, plain_chunk, plain_full
from collect.proxy.dialects import DialectError
from collect.proxy.dialects import anthropic as anthropic_dialect
from collect.proxy.dialects import responses as responses_dialect
from collect.proxy.metrics import Metrics
from collect.proxy.shards import TurnStore
from collect.proxy.upstreams import UpstreamPool
from collect.proxy.wal import read_records, write_all

log = logging.getLogger("wharf.proxy")

_ROLLOUT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_JSON = "application/json"


_dumps = jsonx.dumps


def error_body(message: str, type_: str, code=None) -> dict:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def error_response(status: int, message: str, type_: str = "invalid_request_error", code=None) -> web.Response:
    return web.Response(status=status, body=_dumps(error_body(message, type_, code)), content_type=_JSON)


class Reject(Exception):
    """Bad agent/admin input: answered with an OpenAI-style error, counted, never recorded."""

    def __init__(self, status: int, message: str, reason: str, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.reason, self.type = status, message, reason, type_


class RecordFailure(Exception):
    """The WAL write failed: the answer must not reach the agent unrecorded."""


class UpstreamFailure(Exception):
    """An upstream call that did not give a recordable answer; `status` goes back to the agent."""

    def __init__(self, status: int, message: str, kind: str, body: bytes | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.body = status, message, kind, body


@dataclass
class Rollout:
    rollout_id: str
    api_key: str
    policy: str
    temperature: float
    top_p: float
    seed: int | None = None  # set: call k of the rollout is sampled with seed + k (reproducible rounds)
    state: str = "open"
    next_turn: int = 0
    n_turns: int = 0
    n_errors: int = 0
    inflight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self):
        self.idle.set()


class RecordingProxy:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        p = cfg.proxy
        self.out_dir = Path(p.out_dir) if p.out_dir else cfg.round_dir() / "collect" / "turns"
        self.wal_dir = Path(p.wal_dir) if p.wal_dir else self.out_dir / "_wal"
        self.store = TurnStore(self.out_dir, self.wal_dir, p.shard_rows, p.shard_bytes, p.shard_seconds, p.wal_fsync)
        self.pool = UpstreamPool([cfg.endpoint.url, *p.upstreams], p.health_interval_s)
        self.metrics = Metrics()
        self.rollouts: dict[str, Rollout] = {}
        self.by_key: dict[str, Rollout] = {}
        self.session: aiohttp.ClientSession | None = None
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.recovery: dict = {}
        self._registry_fd: int | None = None
        self._timeout = aiohttp.ClientTimeout(total=p.upstream_timeout_s)
        self._up_headers = {"Content-Type": _JSON, "Authorization": f"Bearer {cfg.endpoint.api_key}"}

    # -- life cycle ---------------------------------------------------------------------------
    async def start(self) -> str:
        """Recover left-overs, bind, and return the base URL (http://host:port)."""
        self.recovery = self.store.recover()
        self._load_registry()
        self.store.start()
        # Large read buffer: a stream's first line carries every prompt id (MBs for long prompts).
        self.session = aiohttp.ClientSession(
            # keepalive under uvicorn's 5 s, so a pooled connection is not reused as the server drops it.
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=3.0), read_bufsize=1 << 22,
            auto_decompress=True)
        self.pool.start(self.session)
        app = web.Application(client_max_size=self.cfg.proxy.max_body_bytes)
        self._routes(app)
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.cfg.proxy.host, self.cfg.proxy.port, backlog=1024)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        host = self.cfg.proxy.host if self.cfg.proxy.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        self.url = f"http://{host}:{port}"
        return self.url

    async def stop(self) -> None:
        """Stop accepting, let calls finish, publish every pending row."""
        if self.runner:
            await self.runner.cleanup()
        self.pool.stop()
        if self.session:
            await self.session.close()
        await self.store.close()
        if self._registry_fd is not None:
            os.close(self._registry_fd)
            self._registry_fd = None

    def public_base(self) -> str:
        return (self.cfg.proxy.public_url or self.url).rstrip("/")

    # -- rollout registry (survives restarts, so agents keep their URLs and keys) ---------------
    def _load_registry(self) -> None:
        path = self.wal_dir / "rollouts.jsonl"
        if path.exists():
            records, bad = read_records(path)
            if bad:
                log.error("%s: %d unreadable registry lines were skipped", path, bad)
            for rec in records:
                rid = rec.get("rollout_id")
                if rec.get("event") == "open":
                    r = Rollout(rid, rec["api_key"], rec["policy"], rec["temperature"], rec["top_p"], rec.get("seed"))
                    self.rollouts[rid] = r
                    self.by_key[r.api_key] = r
                elif rec.get("event") == "close" and rid in self.rollouts:
                    self.rollouts[rid].state = "closed"
            if self.rollouts:
                counts = _row_counts(self.out_dir)
                for rid, r in self.rollouts.items():
                    r.next_turn = self.store.last_turn.get(rid, -1) + 1
                    r.n_turns, r.n_errors = counts.get(rid, (0, 0))
        self._registry_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _registry_append(self, rec: dict) -> None:
        write_all(self._registry_fd, _dumps(rec) + b"\n")

    # -- routes -------------------------------------------------------------------------------
    def _routes(self, app: web.Application) -> None:
        r = app.router
        for root in ("/rollout/{rollout_id}/v1", "/v1"):
            r.add_post(root + "/chat/completions", self.chat)
            r.add_get(root + "/models", self.models)
            r.add_post(root + "/messages", self.messages)
            r.add_post(root + "/messages/count_tokens", self.count_tokens)
            r.add_post(root + "/responses", self.responses)
        r.add_post("/admin/rollouts", self.admin_open)
        r.add_post("/admin/rollouts/{rollout_id}/close", self.admin_close)
        r.add_get("/admin/rollouts/{rollout_id}", self.admin_get)
        r.add_post("/admin/flush", self.admin_flush)
        r.add_get("/health", self.health)
        r.add_get("/metrics", self.get_metrics)

    def _reject(self, e: Reject, dialect=None) -> web.Response:
        self.metrics.inc("rejected_total", help="Requests refused before reaching the endpoint (not recorded)",
                         reason=e.reason)
        if dialect is not None:
            return web.Response(status=e.status, body=_dumps(dialect.error_body(e.status, e.message)),
                                content_type=_JSON)
        return error_response(e.status, e.message, e.type, e.reason)

    def _rollout_for(self, request: web.Request) -> Rollout:
        rid = request.match_info.get("rollout_id")
        if rid is not None:
            r = self.rollouts.get(rid)
            if r is None:
                raise Reject(404, f"unknown rollout '{rid}': open it with POST /admin/rollouts first",
                             "unknown_rollout", "not_found_error")
        else:
            auth = request.headers.get("Authorization", "")
            # Anthropic clients send the key as x-api-key.
            key = auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("x-api-key", "")
            r = self.by_key.get(key)
            if r is None:
                raise Reject(401, "unknown API key: use the api_key POST /admin/rollouts returned, "
                                  "or the /rollout/<id>/v1 base URL", "unknown_key", "authentication_error")
        if r.state != "open":
            raise Reject(403, f"rollout '{r.rollout_id}' is closed", "closed_rollout", "permission_error")
        return r

    async def models(self, request: web.Request) -> web.Response:
        try:
            r = self._rollout_for(request)
        except Reject as e:
            return self._reject(e)
        return web.json_response({"object": "list", "data": [
            {"id": r.policy, "object": "model", "created": 0, "owned_by": "wharf"}]})

    # -- the recorded call --------------------------------------------------------------------
    async def messages(self, request: web.Request) -> web.StreamResponse:
        return await self.chat(request, anthropic_dialect)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self.chat(request, responses_dialect)

    async def count_tokens(self, request: web.Request) -> web.Response:
        """claude-code's /v1/messages/count_tokens: the prompt length from the upstream's /tokenize
        (vLLM and the local engine have it), else a 4-characters-a-token estimate. Not a turn."""
        try:
            rollout = self._rollout_for(request)
            try:
                req = jsonx.loads(await request.read())
            except ValueError as e:
                raise Reject(400, f"request body is not valid JSON ({e})", "bad_json") from None
            try:  # count_tokens takes no max_tokens; the translation needs one
                chat = anthropic_dialect.to_chat({**req, "max_tokens": 1} if isinstance(req, dict) else req)
            except DialectError as e:
                raise Reject(400, str(e), "bad_request") from None
        except Reject as e:
            return self._reject(e, anthropic_dialect)
        body = {"model": rollout.policy, "messages": chat["messages"], "add_generation_prompt": True}
        if chat.get("tools"):
            body["tools"] = chat["tools"]
        n = None
        up = self.pool.order(rollout.rollout_id)[0]
        try:
            async with self.session.post(up.base + "/tokenize", data=_dumps(body), headers=self._up_headers,
                                         timeout=aiohttp.ClientTimeout(total=10)) as resp:
                if resp.status == 200:
                    n = (await resp.json()).get("count")
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            pass
        if not isinstance(n, int):
            n = len(_dumps([chat["messages"], chat.get("tools")])) // 4
        return web.json_response({"input_tokens": n})

    async def chat(self, request: web.Request, dialect=None) -> web.StreamResponse:
        """One recorded call; `dialect` (collect/proxy/dialects) translates a non-chat agent both ways."""
        started = time.time()
        t0 = time.perf_counter()
        try:
            rollout = self._rollout_for(request)
            if request.content_length is not None and request.content_length > self.cfg.proxy.max_body_bytes:
                raise web.HTTPRequestEntityTooLarge(max_size=self.cfg.proxy.max_body_bytes,
                                                    actual_size=request.content_length)
            raw = await request.read()
            try:
                req = jsonx.loads(raw)
            except ValueError as e:
                raise Reject(400, f"request body is not valid JSON ({e})", "bad_json") from None
            if dialect is not None:
                try:
                    chat_req = dialect.to_chat(req)
                except DialectError as e:
                    raise Reject(400, str(e), "bad_request") from None
            else:
                chat_req = req
                if not isinstance(req, dict) or not isinstance(req.get("messages"), list) or not req["messages"]:
                    raise Reject(400, "request body must be a JSON object with a non-empty 'messages' list",
                                 "bad_request")
                if req.get("n") not in (None, 1):
                    raise Reject(400, "n > 1 is not supported by the recording proxy (one completion per call)",
                                 "bad_request")
            if rollout.state != "open":  # closed while the body was read: close has already published
                raise Reject(403, f"rollout '{rollout.rollout_id}' is closed", "closed_rollout", "permission_error")
        except web.HTTPRequestEntityTooLarge:
            return self._reject(Reject(413, f"request body over proxy.max_body_bytes="
                                            f"{self.cfg.proxy.max_body_bytes} bytes", "too_large"), dialect)
        except Reject as e:
            return self._reject(e, dialect)

        turn = rollout.next_turn
        rollout.next_turn += 1
        rollout.inflight += 1
        rollout.idle.clear()
        request_id = uuid.uuid4().hex
        # A translated call keeps its whole chat body in `sampling`: its messages exist nowhere else.
        upstream, sampling = self._upstream_body(chat_req, rollout, turn, full=dialect is not None)
        row = {"rollout_id": rollout.rollout_id, "turn": turn, "request_id": request_id,
               "api": dialect.NAME if dialect is not None else "chat",
               "policy": rollout.policy, "started_at": started, "ended_at": None,
               "request": raw.decode("utf-8", "replace"), "response": None, "sampling": _dumps(sampling).decode(),
               "prompt_token_ids": [], "completion_token_ids": [], "completion_logprobs": [],
               "finish_reason": None, "status": "ok", "error": None}
        headers = {"x-wharf-request-id": request_id, "x-wharf-turn": str(turn)}
        try:
            if chat_req.get("stream"):
                return await self._stream(request, req, rollout, upstream, row, headers, dialect)
            return await self._full(req, rollout, upstream, row, headers, dialect)
        finally:
            rollout.inflight -= 1
            if rollout.inflight == 0:
                rollout.idle.set()
            self.metrics.observe(time.perf_counter() - t0, policy=rollout.policy)

    def _upstream_body(self, req: dict, rollout: Rollout, turn: int, full: bool = False) -> tuple[bytes, dict]:
        up = dict(req)
        up["model"] = rollout.policy
        up["temperature"] = rollout.temperature
        up["top_p"] = rollout.top_p
        if rollout.seed is not None:
            up["seed"] = (rollout.seed + turn) % 2**31
        up["logprobs"] = True
        up["top_logprobs"] = 0
        up["return_token_ids"] = True
        up.pop("include_reasoning", None)  # with a reasoning parser it drops token_ids (notes/vllm.md)
        limits = [v for v in (req.get("max_tokens"), req.get("max_completion_tokens"))
                  if isinstance(v, int) and not isinstance(v, bool)]
        up.pop("max_completion_tokens", None)
        cap = self.cfg.sampling.max_tokens
        if cap is not None:
            limits.append(cap)
        if limits:
            up["max_tokens"] = min(limits)
        if req.get("stream"):
            up["stream_options"] = {**(req.get("stream_options") or {}), "include_usage": True}
        sampling = up if full else {k: v for k, v in up.items() if k not in ("messages", "tools")}
        return _dumps(up), sampling

    async def _send(self, rollout: Rollout, body: bytes) -> aiohttp.ClientResponse:
        """POST to the rollout's upstream; a refused connection (nothing sent) fails over to the next."""
        last: Exception | None = None
        for up in self.pool.order(rollout.rollout_id):
            try:
                return await self.session.post(up.chat_url, data=body, headers=self._up_headers,
                                               timeout=self._timeout)
            except aiohttp.ClientConnectorError as e:
                up.mark_down(f"{type(e).__name__}: {e}")
                last = e
            except asyncio.TimeoutError:
                raise UpstreamFailure(504, f"upstream {up.url} timed out after "
                                           f"{self.cfg.proxy.upstream_timeout_s:g} s", "timeout") from None
            except aiohttp.ClientError as e:
                raise UpstreamFailure(502, f"upstream {up.url} failed: {type(e).__name__}: {e}",
                                      "connection") from None
        raise UpstreamFailure(502, f"no upstream reachable (last: {last})", "unreachable")

    @staticmethod
    async def _http_failure(resp: aiohttp.ClientResponse) -> UpstreamFailure:
        body = await resp.read()
        try:
            err = jsonx.loads(body)
            msg = err.get("error", {}).get("message") if isinstance(err.get("error"), dict) else err.get("message")
            msg = msg or body[:500].decode("utf-8", "replace")
            ok_body = isinstance(err.get("error"), dict)
        except (ValueError, AttributeError):
            msg, ok_body = body[:500].decode("utf-8", "replace"), False
        return UpstreamFailure(resp.status, f"upstream answered {resp.status}: {msg}", f"http_{resp.status}",
                               body if ok_body else None)

    def _record_error(self, rollout: Rollout, row: dict, fail: UpstreamFailure, dialect=None) -> bytes:
        if dialect is not None:  # the agent gets (and the row keeps) the error in its own dialect
            body = _dumps(dialect.error_body(fail.status, fail.message))
        else:
            body = fail.body or _dumps(error_body(fail.message, "upstream_error", fail.status))
        row.update(status="error", error=fail.message, response=body.decode("utf-8", "replace"),
                   ended_at=time.time(), prompt_token_ids=[], completion_token_ids=[], completion_logprobs=[])
        self.metrics.inc("errors_total", help="Recorded calls that failed upstream", policy=rollout.policy,
                         kind=fail.kind)
        try:
            self._commit(rollout, row)
        except RecordFailure as e:
            msg = f"{fail.message}; and {e}"
            return _dumps(dialect.error_body(fail.status, msg) if dialect is not None
                          else error_body(msg, "upstream_error", fail.status))
        return body

    def _commit(self, rollout: Rollout, row: dict) -> None:
        try:
            self.store.add(row)  # WAL write: durable before anything more goes back to the agent
        except OSError as e:
            log.error("WAL write failed for %s turn %s: %s", row["rollout_id"], row["turn"], e)
            self.metrics.inc("record_failures_total", help="Calls that could not be written to the WAL")
            raise RecordFailure(f"the proxy could not record this call (WAL write failed: {e}); "
                                f"check the disk at {self.wal_dir}") from None
        rollout.n_turns += 1
        ok = row["status"] == "ok"
        if not ok:
            rollout.n_errors += 1
        self.metrics.inc("calls_total", help="Recorded calls", policy=rollout.policy, status=row["status"])
        if ok:
            self.metrics.inc("prompt_tokens_total", len(row["prompt_token_ids"]), help="Prompt tokens recorded",
                             policy=rollout.policy)
            self.metrics.inc("completion_tokens_total", len(row["completion_token_ids"]),
                             help="Completion tokens recorded", policy=rollout.policy)

    async def _full(self, req: dict, rollout: Rollout, upstream: bytes, row: dict, headers: dict,
                    dialect=None) -> web.Response:
        try:
            resp = await self._send(rollout, upstream)
            try:
                if resp.status != 200:
                    raise await self._http_failure(resp)
                body = await resp.read()
            except asyncio.TimeoutError:
                raise UpstreamFailure(504, f"upstream timed out after {self.cfg.proxy.upstream_timeout_s:g} s",
                                      "timeout") from None
            except aiohttp.ClientError as e:
                raise UpstreamFailure(502, f"upstream answer broken off: {type(e).__name__}: {e}",
                                      "connection") from None
            finally:
                resp.release()
            try:
                data = jsonx.loads(body)
                if not isinstance(data, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                raise UpstreamFailure(502, f"upstream answer is not valid JSON ({e})", "bad_json") from None
            try:
                got = capture_full(data)
            except CaptureError as e:
                raise UpstreamFailure(502, f"upstream answer unusable for recording: {e}", "no_token_ids") from None
        except UpstreamFailure as fail:
            return web.Response(status=fail.status, body=self._record_error(rollout, row, fail, dialect),
                                content_type=_JSON, headers=headers)
        if dialect is not None:
            out = _dumps(dialect.from_chat(data, req))
        else:
            out = _dumps(plain_full(data, req.get("model"), bool(req.get("logprobs"))))
        row.update(got, response=out.decode(), ended_at=time.time())
        try:
            self._commit(rollout, row)
        except RecordFailure as e:
            if dialect is not None:
                return web.Response(status=503, body=_dumps(dialect.error_body(503, str(e))), content_type=_JSON)
            return error_response(503, str(e), "proxy_error", "record_failed")
        return web.Response(body=out, content_type=_JSON, headers=headers)

    async def _stream(self, request: web.Request, req: dict, rollout: Rollout, upstream: bytes, row: dict,
                      headers: dict, dialect=None) -> web.StreamResponse:
        try:
            resp = await self._send(rollout, upstream)
            if resp.status != 200:
                try:
                    raise await self._http_failure(resp)
                finally:
                    resp.release()
        except UpstreamFailure as fail:
            return web.Response(status=fail.status, body=self._record_error(rollout, row, fail, dialect),
                                content_type=_JSON, headers=headers)
        tr = dialect.Stream(req) if dialect is not None else None  # holds back its own tail
        out = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream; charset=utf-8",
                                          "Cache-Control": "no-cache"})
        agent_model = req.get("model")
        keep_lp = bool(req.get("logprobs"))
        keep_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        cap = StreamCapture()
        held: list[bytes] = []  # from the finish_reason chunk on: sent only after the row is durable
        done = False
        fail: UpstreamFailure | None = None
        agent_gone = False
        buf = b""
        try:
            await out.prepare(request)
            async for block in resp.content.iter_any():
                buf += block
                *lines, buf = buf.split(b"\n")
                send: list[bytes] = []
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue  # blank separators, comments, event names
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    try:
                        chunk = jsonx.loads(payload)
                    except ValueError as e:
                        raise UpstreamFailure(502, f"upstream stream chunk is not valid JSON ({e})", "bad_json")
                    if not isinstance(chunk, dict) or "error" in chunk or chunk.get("object") == "error":
                        err = chunk.get("error") if isinstance(chunk, dict) else None
                        msg = err.get("message") if isinstance(err, dict) else (chunk.get("message")
                                                                                if isinstance(chunk, dict) else chunk)
                        raise UpstreamFailure(502, f"upstream stream error: {msg}", "stream_error")
                    cap.add(chunk)
                    if tr is not None:
                        events = tr.feed(chunk)
                        if events:
                            send.append(events)
                        continue
                    plain = plain_chunk(chunk, agent_model, keep_lp, keep_usage)
                    if plain is not None:
                        data = b"data: " + _dumps(plain) + b"\n\n"
                        (held if held or cap.finish_reason is not None or cap.usage else send).append(data)
                if send:
                    await out.write(b"".join(send))
                if done:
                    break
            if not done:
                raise UpstreamFailure(502, "upstream stream ended without [DONE]", "connection")
            got = cap.result()
        except CaptureError as e:
            fail = UpstreamFailure(502, f"upstream stream unusable for recording: {e}", "no_token_ids")
        except UpstreamFailure as e:
            fail = e
        except asyncio.TimeoutError:
            fail = UpstreamFailure(504, f"upstream timed out after {self.cfg.proxy.upstream_timeout_s:g} s", "timeout")
        except ConnectionResetError as e:
            # The agent went away mid-stream; the call reached the endpoint, so it is still recorded.
            agent_gone = True
            fail = UpstreamFailure(499, f"agent disconnected mid-stream ({e})", "agent_disconnected")
        except aiohttp.ClientError as e:
            fail = UpstreamFailure(502, f"upstream stream broken off: {type(e).__name__}: {e}", "connection")
        finally:
            resp.close()  # also aborts generation upstream when we stop early
        if fail is not None:
            body = self._record_error(rollout, row, fail, dialect)
            if not agent_gone:
                try:
                    await out.write(tr.error(fail.status, fail.message) if tr is not None else b"data: " + body + b"\n\n")
                    await out.write_eof()
                except ConnectionResetError:
                    pass
            return out
        if tr is not None:
            tail = tr.tail()  # built (not sent) first: it closes the last block that final() reports
            row.update(got, response=_dumps(tr.final()).decode(), ended_at=time.time())
        else:
            tail = b"".join(held) + b"data: [DONE]\n\n"
            row.update(got, response=_dumps(cap.message(agent_model)).decode(), ended_at=time.time())
        try:
            self._commit(rollout, row)
        except RecordFailure as e:
            try:  # the held-back tail never goes out: the agent sees an error, not an unrecorded answer
                await out.write(tr.error(503, str(e)) if tr is not None else
                                b"data: " + _dumps(error_body(str(e), "proxy_error", 503)) + b"\n\n")
                await out.write_eof()
            except ConnectionResetError:
                pass
            return out
        try:
            await out.write(tail)
            await out.write_eof()
        except ConnectionResetError:
            pass  # recorded: the answer was complete, the agent left before reading its tail
        return out

    # -- admin --------------------------------------------------------------------------------
    def _admin(self, request: web.Request) -> None:
        auth = request.headers.get("Authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(token.encode(), self.cfg.proxy.admin_token.encode()):
            raise Reject(401, "admin API: missing or wrong bearer token (proxy.admin_token)", "bad_admin_token",
                         "authentication_error")

    def _rollout_info(self, r: Rollout) -> dict:
        return {"rollout_id": r.rollout_id, "state": r.state, "n_turns": r.n_turns, "n_errors": r.n_errors,
                "policy": r.policy, "inflight": r.inflight}

    def _open_answer(self, r: Rollout) -> dict:
        return {"rollout_id": r.rollout_id, "base_url": f"{self.public_base()}/rollout/{r.rollout_id}/v1",
                "api_key": r.api_key, "policy": r.policy}

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
            rid = body.get("rollout_id") or uuid.uuid4().hex
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
                params[k] = float(v)
            seed = body.get("seed")
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                raise Reject(400, f"seed {seed!r}: expected an integer or null", "bad_request")
        except Reject as e:
            return self._reject(e)
        existing = self.rollouts.get(rid)
        if existing is not None:
            if existing.state != "open":
                return self._reject(Reject(409, f"rollout '{rid}' is closed; open a new id", "reopen_closed",
                                           "conflict_error"))
            return web.json_response(self._open_answer(existing), status=200)
        r = Rollout(rid, "wr-" + secrets.token_urlsafe(18), policy, params["temperature"], params["top_p"], seed)
        self._registry_append({"event": "open", "rollout_id": rid, "api_key": r.api_key, "policy": policy,
                               **params, "seed": seed, "t": time.time()})
        self.rollouts[rid] = r
        self.by_key[r.api_key] = r
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
            return self._reject(e)
        if r.state == "open":
            r.state = "closed"
            self._registry_append({"event": "close", "rollout_id": r.rollout_id, "t": time.time()})
            self.metrics.inc("rollouts_closed_total", help="Rollouts closed")
        # Calls already under way finish and are recorded (bounded by the upstream timeout).
        await r.idle.wait()
        await self.store.flush(r.rollout_id)
        return web.json_response({"rollout_id": r.rollout_id, "n_turns": r.n_turns, "n_errors": r.n_errors})

    async def admin_get(self, request: web.Request) -> web.Response:
        try:
            r = self._admin_rollout(request)
        except Reject as e:
            return self._reject(e)
        return web.json_response(self._rollout_info(r))

    async def admin_flush(self, request: web.Request) -> web.Response:
        try:
            self._admin(request)
        except Reject as e:
            return self._reject(e)
        return web.json_response({"shards": await self.store.flush()})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "upstreams": self.pool.describe(),
                                  "open_rollouts": sum(r.state == "open" for r in self.rollouts.values()),
                                  "pending_rows": len(self.store.pending)})

    async def get_metrics(self, request: web.Request) -> web.Response:
        gauges = {"pending_rows": len(self.store.pending), "published_rows_total": self.store.n_published,
                  "shard_write_errors_total": self.store.flush_errors,
                  "open_rollouts": sum(r.state == "open" for r in self.rollouts.values()),
                  "upstreams_healthy": sum(u.healthy for u in self.pool.upstreams)}
        return web.Response(text=self.metrics.render(gauges), content_type="text/plain", charset="utf-8")


def _row_counts(out_dir: Path) -> dict[str, tuple[int, int]]:
    """(rows, error rows) per rollout over the published shards, to resume counters after a restart."""
    counts: dict[str, list[int]] = {}
    for f in sorted(out_dir.glob("part-*.parquet")):
        t = pq.read_table(f, columns=["rollout_id", "status"])
        for rid, st in zip(t.column("rollout_id").to_pylist(), t.column("status").to_pylist()):
            c = counts.setdefault(rid, [0, 0])
            c[0] += 1
            c[1] += st != "ok"
    return {k: (v[0], v[1]) for k, v in counts.items()}




class BackgroundProxy:
    """A RecordingProxy on its own event loop in a daemon thread (tests, or a runner in one process).

    `with BackgroundProxy(cfg) as p: p.url, p.admin(...)`; stopping publishes every pending row.
    """

    def __init__(self, cfg: RunConfig):
        self.proxy = RecordingProxy(cfg)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="wharf-proxy")
        self.url = ""

    def call(self, coro, timeout: float | None = 60):
        """Run a coroutine on the proxy's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> "BackgroundProxy":
        self._thread.start()
        self.url = self.call(self.proxy.start())
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
