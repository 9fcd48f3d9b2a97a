"""Server-sent events from the upstream: `data:` lines -> chat.completion.chunk objects, up to [DONE].

A chunk that is not JSON, an error event, or a stream that ends without [DONE] is an
`UpstreamFailure`: such a call is recorded as an error, never as a half answer.
"""
from __future__ import annotations

from typing import AsyncIterator

from wharf.collect.proxy import jsonx
from wharf.collect.proxy.errors import UpstreamFailure


class ChunkReader:
    """Feed it the bytes as they arrive; it returns the complete chunks and notes [DONE]."""

    def __init__(self):
        self.done = False
        self._buf = b""

    def feed(self, block: bytes) -> list[dict]:
        self._buf += block
        *lines, self._buf = self._buf.split(b"\n")
        chunks = []
        for line in lines:
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, event names
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                break
            chunks.append(parse_chunk(payload))
        return chunks


def parse_chunk(payload: bytes) -> dict:
    try:
        chunk = jsonx.loads(payload)
    except ValueError as e:
        raise UpstreamFailure(502, f"upstream stream chunk is not valid JSON ({e})", "bad_json") from None
    if not isinstance(chunk, dict) or "error" in chunk or chunk.get("object") == "error":
        err = chunk.get("error") if isinstance(chunk, dict) else None
        msg = err.get("message") if isinstance(err, dict) else (chunk.get("message")
                                                                if isinstance(chunk, dict) else chunk)
        raise UpstreamFailure(502, f"upstream stream error: {msg}", "stream_error")
    return chunk


async def chunk_batches(blocks: AsyncIterator[bytes]) -> AsyncIterator[list[dict]]:
    """The chunks of each block read (a batch may be empty), ending at [DONE]."""
    reader = ChunkReader()
    async for block in blocks:
        batch = reader.feed(block)
        yield batch
        if reader.done:
            return
    raise UpstreamFailure(502, "upstream stream ended without [DONE]", "connection")
