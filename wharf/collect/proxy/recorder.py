"""Record, then answer: the one path every recorded call ends on, streamed or not.

The row goes to the write-ahead log first (TurnStore.add) and its fsync is awaited (group commit,
TurnStore.durable); only then does the answer, or the held-back tail of a stream, reach the agent.
When the WAL write or fsync fails the agent gets an error instead, so no answer it acted on is
missing from the data. An upstream failure is recorded as an error row and answered with the
upstream's status. A call whose agent had already hung up when its answer was ready is recorded
as `abandoned`: the agent never saw it (a retry of it is another row).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Protocol

from aiohttp import web

from wharf.collect.proxy.errors import JSON, RecordFailure, UpstreamFailure, error_body
from wharf.collect.proxy.jsonx import dumps
from wharf.collect.proxy.metrics import Metrics
from wharf.collect.proxy.rollouts import Rollout
from wharf.collect.proxy.shards import TurnStore
from wharf.collect.records import TurnRow

log = logging.getLogger("wharf.proxy")


class Reply(Protocol):
    """How a call's answer reaches the agent: a whole response, or the rest of an open stream."""

    dialect: object | None

    def agent_gone(self) -> bool:
        """Whether the agent's connection is already closed (its answer would reach no one)."""

    async def error(self, status: int, message: str, body: bytes) -> web.StreamResponse:
        """`body`: the error as one JSON document in the agent's dialect."""

    async def answer(self) -> web.StreamResponse: ...


def _closed(request: web.BaseRequest | None) -> bool:
    # aiohttp drops the transport when the peer closes; the handler itself is not cancelled.
    return request is not None and (request.transport is None or request.transport.is_closing())


class FullReply:
    def __init__(self, body: bytes, headers: dict, dialect=None, request: web.BaseRequest | None = None):
        self.body, self.headers, self.dialect, self.request = body, headers, dialect, request

    def agent_gone(self) -> bool:
        return _closed(self.request)

    async def error(self, status: int, message: str, body: bytes) -> web.Response:
        return web.Response(status=status, body=body, content_type=JSON, headers=self.headers)

    async def answer(self) -> web.Response:
        return web.Response(body=self.body, content_type=JSON, headers=self.headers)


class StreamReply:
    """An already-prepared event stream; `tail` (the held-back end) is sent only by answer()."""

    def __init__(self, out: web.StreamResponse, stream=None, dialect=None, request: web.BaseRequest | None = None):
        self.out, self.stream, self.dialect, self.request = out, stream, dialect, request
        self.dropped = False  # a write to the agent failed mid-stream
        self.tail = b""

    def agent_gone(self) -> bool:
        return self.dropped or _closed(self.request)

    async def _end(self, data: bytes) -> web.StreamResponse:
        if not self.dropped:
            try:
                await self.out.write(data)
                await self.out.write_eof()
            except ConnectionResetError:
                pass  # the agent left; what matters (the row) is settled
        return self.out

    async def error(self, status: int, message: str, body: bytes) -> web.StreamResponse:
        return await self._end(self.stream.error(status, message) if self.stream is not None
                               else b"data: " + body + b"\n\n")

    async def answer(self) -> web.StreamResponse:
        return await self._end(self.tail)


def _error_json(dialect, status: int, message: str, type_: str, code) -> bytes:
    return dumps(dialect.error_body(status, message) if dialect is not None else error_body(message, type_, code))


class Recorder:
    def __init__(self, store: TurnStore, metrics: Metrics):
        self.store = store
        self.metrics = metrics

    async def commit(self, rollout: Rollout, row: TurnRow) -> None:
        """The row into the WAL, the rollout's counters, and its fsync awaited; RecordFailure if not."""
        try:
            seq = self.store.add(row.as_dict())
        except OSError as e:
            raise self._failure(row, "WAL write", e) from None
        self._count(rollout, row)
        try:
            await self.store.durable(seq)
        except OSError as e:
            # The row may still reach a shard (its bytes are in the page cache), but the agent is told.
            raise self._failure(row, "WAL fsync", e) from None

    def _failure(self, row: TurnRow, what: str, e: OSError) -> RecordFailure:
        log.error("%s failed for %s turn %s: %s", what, row.rollout_id, row.turn, e)
        self.metrics.inc("record_failures_total", help="Calls that could not be written to the WAL")
        return RecordFailure(f"the proxy could not record this call ({what} failed: {e}); "
                             f"check the disk at {Path(self.store.wal.dir)}")

    def _count(self, rollout: Rollout, row: TurnRow) -> None:
        rollout.n_turns += 1
        ok = row.status == "ok"
        if row.status == "error":  # upstream failures only: an abandoned call may have completed
            rollout.n_errors += 1
        self.metrics.inc("calls_total", help="Recorded calls", policy=rollout.policy, status=row.status)
        if ok:
            self.metrics.inc("prompt_tokens_total", len(row.prompt_token_ids), help="Prompt tokens recorded",
                             policy=rollout.policy)
            self.metrics.inc("completion_tokens_total", len(row.completion_token_ids),
                             help="Completion tokens recorded", policy=rollout.policy)

    def _abandoned(self, rollout: Rollout) -> None:
        self.metrics.inc("abandoned_total", help="Calls whose agent hung up before the answer", policy=rollout.policy)

    async def _record_error(self, rollout: Rollout, row: TurnRow, fail: UpstreamFailure, dialect,
                            gone: bool) -> tuple[str, bytes]:
        """Record the failed call; the message and body the agent gets (in its own dialect)."""
        if dialect is not None or fail.body is None:
            body = _error_json(dialect, fail.status, fail.message, "upstream_error", fail.status)
        else:
            body = fail.body
        row.status, row.error, row.ended_at = "abandoned" if gone else "error", fail.message, time.time()
        row.response = body.decode("utf-8", "replace")
        row.prompt_token_ids, row.completion_token_ids, row.completion_logprobs = [], [], []
        if gone:
            self._abandoned(rollout)
        else:
            self.metrics.inc("errors_total", help="Recorded calls that failed upstream", policy=rollout.policy,
                             kind=fail.kind)
        try:
            await self.commit(rollout, row)
        except RecordFailure as e:
            msg = f"{fail.message}; and {e}"
            return msg, _error_json(dialect, fail.status, msg, "upstream_error", fail.status)
        return fail.message, body

    async def settle(self, rollout: Rollout, row: TurnRow, result: dict | UpstreamFailure, response: bytes | None,
                     reply: Reply) -> web.StreamResponse:
        """Record the call's `result` (captured ids or a failure), then answer the agent through `reply`."""
        gone = reply.agent_gone()
        if isinstance(result, UpstreamFailure):
            message, body = await self._record_error(rollout, row, result, reply.dialect, gone)
            return await reply.error(result.status, message, body)
        row.prompt_token_ids = result["prompt_token_ids"]
        row.completion_token_ids = result["completion_token_ids"]
        row.completion_logprobs = result["completion_logprobs"]
        row.finish_reason = result["finish_reason"]
        row.response, row.ended_at = response.decode(), time.time()
        if gone:  # the answer is complete but reaches no one: kept for the record, never trained on
            row.status, row.error = "abandoned", "the agent closed its connection before the answer was sent"
            self._abandoned(rollout)
        try:
            await self.commit(rollout, row)
        except RecordFailure as e:
            # The answer (or a stream's held-back tail) never goes out unrecorded.
            return await reply.error(503, str(e), _error_json(reply.dialect, 503, str(e), "proxy_error",
                                                              "record_failed"))
        return await reply.answer()
