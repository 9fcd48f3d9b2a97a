"""JSON for the proxy's hot path: orjson (several times faster than json), json where orjson refuses.

orjson rejects NaN/Infinity (which a server may still send) and integers beyond 64 bits; those
rare documents go through the standard library instead, so nothing valid is refused.
"""
from __future__ import annotations

import array
import json

import orjson


def _default(obj):
    if isinstance(obj, array.array):  # token ids / log-probs are kept as compact arrays
        return obj.tolist()
    raise TypeError(f"cannot serialize {type(obj).__name__}")


def loads(data: bytes | str):
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)  # raises ValueError itself when the text really is not JSON


def dumps(obj) -> bytes:
    try:
        return orjson.dumps(obj, default=_default)
    except TypeError:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=_default).encode()
