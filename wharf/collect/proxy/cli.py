"""`wharf proxy --config FILE [key=value ...]`: serve until SIGTERM/SIGINT, then publish every row
(`python -m wharf.collect.proxy`, as the runner starts it)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from pathlib import Path

from wharf.collect.proxy.server import RecordingProxy
from wharf.core.config import cli_config
from wharf.core.entry import guarded
from wharf.core.errors import WharfError
from wharf.core.layout import CollectPaths, admin_file
from wharf.core.ports import check_bindable


async def serve(cfg) -> None:
    proxy = RecordingProxy(cfg)
    try:
        url = await proxy.start()
    except BaseException:
        with contextlib.suppress(Exception):  # what it opened (its client session, the WAL)
            await proxy.stop()
        admin_file(proxy.wal_dir).unlink(missing_ok=True)  # its token, of a proxy that never served
        raise
    rec = proxy.recovery
    if rec.get("segments"):
        print(f"wharf proxy: folded {rec['recovered_rows']} rows from {rec['segments']} left-over WAL "
              f"segments into {rec['shard']}", flush=True)
    # One line the runner and tests wait for; the port is the bound one (proxy.port=0 picks a free one).
    print(f"wharf proxy listening on {url} (turns -> {proxy.out_dir})", flush=True)
    print(f"wharf proxy admin API on {proxy.admin_url} (its URL and token: {admin_file(proxy.wal_dir)})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await proxy.stop()
    print("wharf proxy stopped; every row is published", flush=True)


def main(argv: list[str] | None = None, prog: str = "wharf proxy") -> int:
    cfg = cli_config(argv, prog, "Serve the recording proxy until SIGTERM/SIGINT, then publish every row.")
    return guarded(prog, lambda: _serve(cfg))


def check_start(cfg) -> None:
    """Before anything is written (WAL, admin.json with its token): the ports bind, and a proxy
    started by hand does not record into a finished round (the runner always sets proxy.out_dir)."""
    p = cfg.proxy
    if p.out_dir is None:
        paths = cfg.round_layout.collect
        if paths.manifest.is_file() and load_state(paths) == "done":
            raise WharfError(f"{paths.root} is a finished collect round: set proxy.out_dir=DIR for the turns of a "
                             "proxy of your own (or name=/round= for a new round)")
    for key, d in (("proxy.out_dir", p.out_dir), ("proxy.wal_dir", p.wal_dir)):
        if d is not None and "://" not in d and Path(d).exists() and not Path(d).is_dir():
            raise WharfError(f"{key}={d}: is a file, not a directory")
    if p.port and p.port == p.admin_port:
        raise WharfError(f"proxy.port and proxy.admin_port are both {p.port}: give each its own (admin_port=0 picks "
                         "a free one)")
    check_bindable(p.host, p.port, "proxy.port")
    check_bindable(p.admin_host, p.admin_port, "proxy.admin_port")


def load_state(paths: CollectPaths) -> str | None:
    try:
        return json.loads(paths.manifest.read_text()).get("state")
    except (OSError, ValueError, AttributeError):
        return None


def _serve(cfg) -> int:
    check_start(cfg)
    try:
        asyncio.run(serve(cfg))
    except OSError as e:  # e.g. the port is taken
        p = cfg.proxy
        raise WharfError(f"cannot serve on {p.host}:{p.port} (agents) and {p.admin_host}:{p.admin_port} "
                         f"(admin): {e}") from None
    return 0
