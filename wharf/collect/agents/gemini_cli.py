"""harbor's gemini-cli agent, offline: the pinned npm CLI (make agents) instead of a download.

Everything but install() is harbor's own GeminiCli: `gemini --yolo --model=<policy>
--prompt=...`, its output in agent/gemini-cli.txt and its session file (~/.gemini/tmp/*/chats/)
copied to agent/gemini-cli.trajectory.jsonl, the endpoint as GOOGLE_GEMINI_BASE_URL with
GEMINI_API_KEY (Gemini's generateContent API: the proxy's gemini dialect). harbor's run() writes
~/.gemini/settings.json (the auth type) over whatever install() left, so the switches that turn
telemetry, usage statistics and the update check off join the settings it writes. (A system
settings file, GEMINI_CLI_SYSTEM_SETTINGS_PATH, would not do: gemini-cli skips one with a
group- or world-writable ancestor, as /tmp is, and no other path is writable in every sandbox.)

Load it by import path `wharf.collect.agents.gemini_cli:LocalGeminiCli`. Extra kwargs on top of harbor's
gemini-cli options: base_url (the rollout's .../v1 route; gemini-cli appends /v1beta/models/...
itself, so /v1 is cut off) and api_key.
"""
from __future__ import annotations

from typing import Any

from harbor.agents.installed.gemini_cli import GeminiCli
from pydantic import Field

from wharf.collect.agents import node_clis
from wharf.collect.agents.pinned import Pinned

# Each would reach for the internet from an offline sandbox.
QUIET_SETTINGS = {
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
}


class LocalGeminiCliOptions(GeminiCli.options_model):  # type: ignore[name-defined,misc]
    base_url: str | None = Field(default=None, description="the rollout's base URL (.../v1 or without)")
    api_key: str | None = Field(default=None, description="API key (any string the proxy accepts)")


class LocalGeminiCli(Pinned, GeminiCli):
    agent_name, binary, clis = "gemini-cli", "gemini", node_clis
    options_model = LocalGeminiCliOptions

    def __init__(self, *args: Any, extra_env: dict[str, str] | None = None, **kwargs: Any) -> None:
        env = {**node_clis.cli_env(), **(extra_env or {})}
        if kwargs.get("base_url"):
            env["GOOGLE_GEMINI_BASE_URL"] = node_clis.route_root(kwargs["base_url"])
        if kwargs.get("api_key"):
            env["GEMINI_API_KEY"] = kwargs["api_key"]
        super().__init__(*args, extra_env=env, **kwargs)

    def _build_settings_config(self, model: str | None = None,
                               auth_type: str | None = None) -> tuple[dict[str, Any] | None, str | None]:
        config, alias = super()._build_settings_config(model, auth_type)
        return {**(config or {}), **QUIET_SETTINGS}, alias
