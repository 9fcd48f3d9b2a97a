"""The recording proxy: OpenAI chat completions in, vLLM with token ids out, every call a `turns` row.

Agents reach it at /rollout/<id>/v1 (or plain /v1 with a per-rollout API key); the collect
runner opens and closes rollouts through /admin. Each call is forwarded with the recording
parameters forced (return_token_ids, logprobs, the configured temperature/top_p), its row is
in the write-ahead log before the agent gets its answer, and shards are published in the
background (collect/proxy/shards.py).

This module assembles the app and holds the recording path; the rollout registry is in
rollouts.py and the /admin, /health and /metrics routes in admin.py.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from pathlib import Path

import aiohttp
from aiohttp import web

from collect.config import RunConfig
from collect.proxy import jsonx
from collect.proxy.admin import AdminAPI
from collect.proxy.capture import CaptureError, StreamCapture, capture_full, plain_chunk, plain_full
from collect.proxy.dialects import DialectError
from collect.proxy.dialects import anthropic as anthropic_dialect
from collect.proxy.dialects import responses as responses_dialect
from collect.proxy.errors import JSON as _JSON
from collect.proxy.errors import Reject, error_body, error_response, reject_response
from collect.proxy.metrics import Metrics
from collect.proxy.rollouts import Rollout, RolloutRegistry
from collect.proxy.shards import TurnStore
from collect.proxy.upstreams import UpstreamPool

log = logging.getLogger("wharf.proxy")

_dumps = jsonx.dumps


class RecordFailure(Exception):
    """The WAL write failed: the answer must not reach the agent unrecorded."""


class UpstreamFailure(Exception):
    """An upstream call that did not give a recordable answer; `status` goes back to the agent."""

    def __init__(self, status: int, message: str, kind: str, body: bytes | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.body = status, message, kind, body


class RecordingProxy:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        p = cfg.proxy
        self.out_dir = Path(p.out_dir) if p.out_dir else cfg.round_dir() / "collect" / "turns"
        self.wal_dir = Path(p.wal_dir) if p.wal_dir else self.out_dir / "_wal"
        self.store = TurnStore(self.out_dir, self.wal_dir, p.shard_rows, p.shard_bytes, p.shard_seconds, p.wal_fsync)
        self.pool = UpstreamPool([cfg.endpoint.url, *p.upstreams], p.health_interval_s)
        self.metrics = Metrics()
        self.rollouts = RolloutRegistry(self.wal_dir / "rollouts.jsonl")
        self.admin = AdminAPI(cfg, self.rollouts, self.store, self.pool, self.metrics, self.public_base)
        self.session: aiohttp.ClientSession | None = None
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.recovery: dict = {}
        self._timeout = aiohttp.ClientTimeout(total=p.upstream_timeout_s)
        self._up_headers = {"Content-Type": _JSON, "Authorization": f"Bearer {cfg.endpoint.api_key}"}

    # -- life cycle ---------------------------------------------------------------------------
    async def start(self) -> str:
        """Recover left-overs, bind, and return the base URL (http://host:port)."""
        self.recovery = self.store.recover()
        # After recovery: the WAL's last turns say where each rollout's turns resume.
        self.rollouts.load(self.store.last_turn, self.out_dir)
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
        self.admin.add_routes(r)

    async def models(self, request: web.Request) -> web.Response:
        try:
            r = self.rollouts.for_request(request)
        except Reject as e:
            return reject_response(self.metrics, e)
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
            rollout = self.rollouts.for_request(request)
            try:
                req = jsonx.loads(await request.read())
            except ValueError as e:
                raise Reject(400, f"request body is not valid JSON ({e})", "bad_json") from None
            try:  # count_tokens takes no max_tokens; the translation needs one
                chat = anthropic_dialect.to_chat({**req, "max_tokens": 1} if isinstance(req, dict) else req)
            except DialectError as e:
                raise Reject(400, str(e), "bad_request") from None
        except Reject as e:
            return reject_response(self.metrics, e, anthropic_dialect)
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
            rollout = self.rollouts.for_request(request)
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
            return reject_response(self.metrics, Reject(413, f"request body over proxy.max_body_bytes="
                                                             f"{self.cfg.proxy.max_body_bytes} bytes", "too_large"),
                                   dialect)
        except Reject as e:
            return reject_response(self.metrics, e, dialect)

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
