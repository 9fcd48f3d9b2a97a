"""harbor's opencode agent, offline: the pinned npm CLI (make agents) instead of a download.

Everything but install() is harbor's own OpenCode: `opencode --model=openai/<policy> run
--format=json`, its JSON events in agent/opencode.txt, the endpoint as the openai provider's
baseURL in opencode.json. Auto-update, the models.dev fetch, sharing, LSP downloads and default
plugins are off (each would reach for the internet).

Load it by import path `wharf.collect.agents.opencode:LocalOpenCode`. Extra kwargs on top of harbor's
opencode options: base_url (the rollout's .../v1 route) and api_key.
"""
from __future__ import annotations

from typing import Any

from harbor.agents.installed.opencode import OpenCode
from pydantic import Field

from wharf.collect.agents import node_clis
from wharf.collect.agents.pinned import Pinned

QUIET_ENV = {f"OPENCODE_DISABLE_{k}": "1" for k in
             ("AUTOUPDATE", "MODELS_FETCH", "SHARE", "LSP_DOWNLOAD", "DEFAULT_PLUGINS", "CLAUDE_CODE")}


class LocalOpenCodeOptions(OpenCode.options_model):  # type: ignore[name-defined,misc]
    base_url: str | None = Field(default=None, description="the rollout's base URL (.../v1)")
    api_key: str | None = Field(default=None, description="API key (any string the proxy accepts)")


class LocalOpenCode(Pinned, OpenCode):
    agent_name, binary, clis = "opencode", "opencode", node_clis
    options_model = LocalOpenCodeOptions

    def __init__(self, *args: Any, extra_env: dict[str, str] | None = None, **kwargs: Any) -> None:
        env = {**QUIET_ENV, **node_clis.cli_env(), **(extra_env or {})}
        if kwargs.get("base_url"):
            env["OPENAI_BASE_URL"] = kwargs["base_url"]
        if kwargs.get("api_key"):
            env["OPENAI_API_KEY"] = kwargs["api_key"]
        super().__init__(*args, extra_env=env, **kwargs)
