"""harbor's qwen-code agent, offline: the pinned npm CLI (make agents) instead of a download.

Everything but install() is harbor's own QwenCode: `qwen --yolo --auth-type openai
--chat-recording --prompt=...`, its output in agent/qwen-code.txt and its chat recording copied
to agent/qwen-sessions/ in the trial dir, the endpoint as OPENAI_BASE_URL (chat completions).
Telemetry, usage statistics and the update check are off in ~/.qwen/settings.json, which install()
writes (harbor writes that file only when MCP servers are configured).

Load it by import path `wharf.collect.agents.qwen_code:LocalQwenCode`. Extra kwargs on top of harbor's
qwen-code options: base_url (the rollout's .../v1 route) and api_key (harbor's own options).
"""
from __future__ import annotations

import json
import shlex
from typing import Any

from harbor.agents.installed.qwen_code import QwenCode

from wharf.collect.agents import node_clis
from wharf.collect.agents.pinned import Pinned

# Each would reach for the internet (or the user's terminal) from an offline sandbox.
QUIET_SETTINGS = {
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False},
}


class LocalQwenCode(Pinned, QwenCode):
    agent_name, binary, clis = "qwen-code", "qwen", node_clis

    def __init__(self, *args: Any, extra_env: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, extra_env={**node_clis.cli_env(), **(extra_env or {})}, **kwargs)

    def install_command(self) -> str:
        settings = shlex.quote(json.dumps(QUIET_SETTINGS))
        return (super().install_command() +
                f' && mkdir -p "$HOME/.qwen" && echo {settings} > "$HOME/.qwen/settings.json"')
