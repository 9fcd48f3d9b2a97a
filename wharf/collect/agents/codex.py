"""harbor's codex agent, offline: the pinned npm CLI (make agents) instead of a download.

Everything but install() is harbor's own Codex: `codex exec --json --dangerously-bypass-approvals-
and-sandbox --enable unified_exec`, its --json events in agent/codex.txt and the session rollout
copied to agent/sessions/ in the trial dir, the endpoint as `openai_base_url` in
$CODEX_HOME/config.toml with an API key (no sign-in). The update check and analytics are off in
that config; codex still sends its hosted web_search tool, which the proxy drops and counts.

Load it by import path `wharf.collect.agents.codex:LocalCodex`. Extra kwargs on top of harbor's codex
options: base_url (the rollout's .../v1 route) and api_key; `config` (a dict) is laid over the
quiet defaults.
"""
from __future__ import annotations

from typing import Any

from harbor.agents.installed.codex import Codex, CodexOptions
from pydantic import Field

from wharf.collect.agents import node_clis
from wharf.collect.agents.pinned import Pinned

QUIET_CONFIG = {"check_for_update_on_startup": False, "analytics": {"enabled": False}}


class LocalCodexOptions(CodexOptions):
    base_url: str | None = Field(default=None, description="the rollout's base URL (.../v1)")
    api_key: str | None = Field(default=None, description="API key (any string the proxy accepts)")


class LocalCodex(Pinned, Codex):
    agent_name, binary, clis = "codex", "codex", node_clis
    options_model = LocalCodexOptions
    options: LocalCodexOptions

    def __init__(self, *args: Any, extra_env: dict[str, str] | None = None, **kwargs: Any) -> None:
        env = {**node_clis.cli_env(), **(extra_env or {})}
        if kwargs.get("base_url"):
            env["OPENAI_BASE_URL"] = kwargs["base_url"]
        if kwargs.get("api_key"):
            env["OPENAI_API_KEY"] = kwargs["api_key"]
        config = kwargs.get("config")
        if config is None or isinstance(config, dict):
            kwargs["config"] = {**QUIET_CONFIG, **(config or {})}
        super().__init__(*args, extra_env=env, **kwargs)
