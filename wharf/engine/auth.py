"""vLLM's --api-key for the engine (and the vLLM stub): /v1 routes need `Authorization: Bearer KEY`.

As vLLM's AuthenticationMiddleware: a missing or wrong key gets 401 with the body
{"error": "Unauthorized"}; OPTIONS and every path outside /v1 (/health, /tokenize, /detokenize)
stay open, since none of them samples or loads anything.
"""
from __future__ import annotations

from aiohttp import web

from wharf.core.credentials import bearer, same


def auth_middleware(api_key: str):
    @web.middleware
    async def auth(request: web.Request, handler):
        if request.method != "OPTIONS" and request.path.startswith("/v1") \
                and not same(bearer(request.headers), api_key):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return auth
