"""harbor's aider agent, offline: aider-chat pinned in a venv of its own (make agents-py, under
.venv-agents/aider: its exact pins would clash with wharf's) instead of aider.chat's installer.

Everything but install() is harbor's own Aider: `aider --yes --message=... --model=...`, its output
in agent/aider.txt and its chat history in agent/aider.chat.history.md. Set through aider's own
AIDER_* environment options: no update check, analytics, model warnings, git or repo map (each
reaches for the internet or makes side calls), and its LLM history (every call's messages and
answer) in agent/aider.llm.history.txt, the log the rows are checked against.

Load it by import path `wharf.collect.agents.aider:LocalAider`. harbor hands aider the model without
its provider; aider's litellm needs one, so the model goes as `openai/<policy>`.
"""
from __future__ import annotations

from typing import Any

from harbor.agents.installed.aider import Aider

from wharf.collect.agents import py_clis
from wharf.collect.agents.pinned import Pinned

LLM_HISTORY = "aider.llm.history.txt"

QUIET_ENV = {
    "AIDER_CHECK_UPDATE": "false", "AIDER_ANALYTICS_DISABLE": "true", "AIDER_SHOW_MODEL_WARNINGS": "false",
    "AIDER_SHOW_RELEASE_NOTES": "false", "AIDER_GIT": "false", "AIDER_AUTO_COMMITS": "false",
    "AIDER_MAP_TOKENS": "0", "AIDER_DETECT_URLS": "false", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "AIDER_LLM_HISTORY_FILE": f"/logs/agent/{LLM_HISTORY}",
}


class LocalAider(Pinned, Aider):
    agent_name, binary, clis = "aider", "aider", py_clis
    options_model = py_clis.endpoint_options(Aider.options_model)

    def __init__(self, *args: Any, extra_env: dict[str, str] | None = None, model_name: str | None = None,
                 **kwargs: Any) -> None:
        if model_name and model_name.startswith("openai/") and not model_name.startswith("openai/openai/"):
            model_name = "openai/" + model_name  # harbor strips one provider prefix; litellm needs one
        env = {**QUIET_ENV, **py_clis.cli_env(kwargs), **(extra_env or {})}
        super().__init__(*args, extra_env=env, model_name=model_name, **kwargs)
