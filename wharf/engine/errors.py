"""vLLM's error bodies: {"error": {"message", "type", "param", "code"}} with the HTTP status as code."""
from __future__ import annotations

import json

from aiohttp import web


class APIError(Exception):
    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError",
                 param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.err_type, self.param = message, status, err_type, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param,
                          "code": self.status}}

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status)


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(message, 400, "BadRequestError", param)


def not_found(message: str, param: str | None = None) -> APIError:
    return APIError(message, 404, "NotFoundError", param)


def internal(message: str) -> APIError:
    return APIError(message, 500, "InternalServerError")


async def read_json(request: web.Request) -> dict:
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    return body
