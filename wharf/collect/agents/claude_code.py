"""harbor's claude-code agent, offline: the pinned npm CLI (make agents) instead of a download.

Everything but install() is harbor's own ClaudeCode: `claude --verbose --output-format=stream-json
--print` with bypassPermissions, its stream-json output in agent/claude-code.txt and the session
transcript under agent/sessions/projects/ (CLAUDE_CONFIG_DIR points into the trial's logs), both
kept in the trial dir. Telemetry, error reporting, auto-update and non-essential traffic are off;
an API key means no sign-in.

Load it by import path `wharf.collect.agents.claude_code:LocalClaudeCode`. Extra kwargs on top of
harbor's claude-code options: base_url (the rollout's .../v1 route; claude-code appends
/v1/messages itself, so /v1 is cut off) and api_key. The model name reaches the proxy as sent;
the proxy serves the rollout's policy whatever it is.
"""
from __future__ import annotations

from typing import Any

from harbor.agents.installed.claude_code import ClaudeCode, ClaudeCodeOptions
from pydantic import Field

from wharf.collect.agents import node_clis
from wharf.collect.agents.pinned import Pinned

QUIET_ENV = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
}


class LocalClaudeCodeOptions(ClaudeCodeOptions):
    base_url: str | None = Field(default=None, description="the rollout's base URL (.../v1 or without)")
    api_key: str | None = Field(default=None, description="API key (any string the proxy accepts)")


# claude-code's ANTHROPIC_BASE_URL: the route without its /v1.
anthropic_root = node_clis.route_root


class LocalClaudeCode(Pinned, ClaudeCode):
    agent_name, binary, clis = "claude-code", "claude", node_clis
    options_model = LocalClaudeCodeOptions
    options: LocalClaudeCodeOptions

    def __init__(self, *args: Any, extra_env: dict[str, str] | None = None, **kwargs: Any) -> None:
        env = {**QUIET_ENV, **node_clis.cli_env(), **(extra_env or {})}
        if kwargs.get("base_url"):
            env["ANTHROPIC_BASE_URL"] = anthropic_root(kwargs["base_url"])
        if kwargs.get("api_key"):
            env["ANTHROPIC_API_KEY"] = kwargs["api_key"]
        super().__init__(*args, extra_env=env, **kwargs)

    def install_command(self) -> str:
        return node_clis.install_check("claude", link_as="claude")
