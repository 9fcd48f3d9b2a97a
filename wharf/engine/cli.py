"""`wharf serve --config FILE [key=value ...]`: serve the engine section of a run config
(`python -m wharf.engine`, as the endpoint launcher starts it)."""
from __future__ import annotations

from wharf.core.config import cli_config
from wharf.core.entry import guarded
from wharf.core.ports import check_bindable


def main(argv: list[str] | None = None, prog: str = "wharf serve") -> int:
    cfg = cli_config(argv, prog, "Serve the local engine (vLLM's HTTP API) for the engine section.").engine
    return guarded(prog, lambda: _serve(cfg))


def _serve(cfg) -> int:
    check_bindable(cfg.host, cfg.port, "engine.port")  # before torch loads, and the model (seconds)
    from aiohttp import web

    from .server import Engine, make_app

    engine = Engine(cfg)  # a ModelError (no such model) is one line and exit 1
    auth = "with engine.api_key required on /v1" if cfg.api_key else "open to anyone who reaches it"
    print(f"engine: serving {cfg.served_name} ({engine.model_dir}) on http://{cfg.host}:{cfg.port} ({auth})",
          flush=True)
    web.run_app(make_app(engine), host=cfg.host, port=cfg.port, print=None, access_log=None)
    return 0
