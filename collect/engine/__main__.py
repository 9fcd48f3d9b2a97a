"""`python -m collect.engine --config FILE [key=value ...]`: serve the engine section of a run config."""
from __future__ import annotations

from wharf import envdefaults

envdefaults.apply()  # before torch loads

import logging  # noqa: E402
import sys  # noqa: E402

from wharf.config import cli_config  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    cfg = cli_config(argv, "python -m collect.engine").engine
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from aiohttp import web

    from wharf.model_store import ModelError
    from .server import Engine, make_app

    try:
        engine = Engine(cfg)
    except ModelError as e:
        print(f"collect.engine: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    auth = "with engine.api_key required on /v1" if cfg.api_key else "open to anyone who reaches it"
    print(f"collect.engine: serving {cfg.served_name} ({engine.model_dir}) on http://{cfg.host}:{cfg.port} ({auth})",
          flush=True)
    web.run_app(make_app(engine), host=cfg.host, port=cfg.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
