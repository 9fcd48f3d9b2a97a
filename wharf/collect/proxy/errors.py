"""Refusals and failures shared by the agent routes, the rollout registry, the admin API and the
recording path.

Its own module so that the others all import it and never each other the wrong way round
(server -> admin -> rollouts -> errors).
"""
from __future__ import annotations

from aiohttp import web

from wharf.collect.proxy.jsonx import dumps
from wharf.collect.proxy.metrics import Metrics

JSON = "application/json"


def error_body(message: str, type_: str, code=None) -> dict:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def error_response(status: int, message: str, type_: str = "invalid_request_error", code=None) -> web.Response:
    return web.Response(status=status, body=dumps(error_body(message, type_, code)), content_type=JSON)


class Reject(Exception):
    """Bad agent/admin input: answered with an OpenAI-style error, counted, never recorded."""

    def __init__(self, status: int, message: str, reason: str, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.reason, self.type = status, message, reason, type_


def reject_response(metrics: Metrics, e: Reject, dialect=None) -> web.Response:
    """Count the refusal and answer it, in the agent's dialect when it speaks one."""
    metrics.inc("rejected_total", help="Requests refused before reaching the endpoint (not recorded)",
                reason=e.reason)
    if dialect is not None:
        return web.Response(status=e.status, body=dumps(dialect.error_body(e.status, e.message)), content_type=JSON)
    return error_response(e.status, e.message, e.type, e.reason)


class UpstreamFailure(Exception):
    """An upstream call that gave no recordable answer: recorded as an error row, `status` goes to the agent.

    `body`: the upstream's own OpenAI-style error body, passed on as is when it has one.
    """

    def __init__(self, status: int, message: str, kind: str, body: bytes | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.body = status, message, kind, body


class RecordFailure(Exception):
    """The WAL write failed: the answer must not reach the agent unrecorded."""
