"""One command run to its end from the host side: stdin fed, stdout and stderr read (and handed
to a callback as they come), the whole process group killed on a timeout or a cancel."""
from __future__ import annotations

import asyncio
import os
import signal
from typing import Awaitable, Callable

OnChunk = Callable[[str, str], Awaitable[None]]  # (text, "stdout" | "stderr")


class SandboxTimeoutError(RuntimeError):
    """An exec ran past its timeout (a RuntimeError, as harbor's docker environment raises)."""


async def run_process(cmd: list[str], fds: tuple[int, ...] | list[int] = (), *, stdin: bytes | None = None,
                      timeout_sec: float | None = None, on_chunk: OnChunk | None = None) -> tuple[int, bytes, bytes]:
    """(exit code, stdout, stderr) of `cmd`, started in a session of its own with `fds` passed."""
    proc = await asyncio.create_subprocess_exec(
        *cmd, pass_fds=fds,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # one process group to kill on timeout or cancel
    )
    chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}

    async def pump(reader: asyncio.StreamReader, name: str) -> None:
        while chunk := await reader.read(65536):
            chunks[name].append(chunk)
            if on_chunk is not None:
                await on_chunk(chunk.decode(errors="replace"), name)

    async def run_all() -> int:
        await asyncio.gather(_feed(proc, stdin), pump(proc.stdout, "stdout"), pump(proc.stderr, "stderr"))
        return await proc.wait()

    try:
        rc = await asyncio.wait_for(run_all(), timeout=timeout_sec) if timeout_sec else await run_all()
    except asyncio.TimeoutError:
        await kill_group(proc)
        raise SandboxTimeoutError(f"Command timed out after {timeout_sec} seconds") from None
    except BaseException:
        await kill_group(proc)
        raise
    return rc, b"".join(chunks["stdout"]), b"".join(chunks["stderr"])


async def _feed(proc: asyncio.subprocess.Process, stdin: bytes | None) -> None:
    if stdin is None:
        return
    try:
        proc.stdin.write(stdin)
        await proc.stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        proc.stdin.close()


async def kill_group(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        await asyncio.wait_for(proc.wait(), timeout=10)
    except asyncio.TimeoutError:
        pass
