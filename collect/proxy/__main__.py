"""`python -m collect.proxy --config FILE [key=value ...]`: serve until SIGTERM/SIGINT, then publish every row."""
from __future__ import annotations

from wharf import envdefaults

envdefaults.apply()

import asyncio  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

from wharf.config import cli_config  # noqa: E402
from wharf.layout import admin_file  # noqa: E402
from collect.proxy.server import RecordingProxy  # noqa: E402


async def serve(cfg) -> None:
    proxy = RecordingProxy(cfg)
    url = await proxy.start()
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


def main(argv: list[str] | None = None) -> None:
    cfg = cli_config(argv, "python -m collect.proxy")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    try:
        asyncio.run(serve(cfg))
    except OSError as e:  # e.g. the port is taken
        p = cfg.proxy
        print(f"python -m collect.proxy: cannot serve on {p.host}:{p.port} (agents) and {p.admin_host}:{p.admin_port} "
              f"(admin): {e}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
