"""harbor's Vibe agent (Mistral's mistral-vibe CLI), offline: mistral-vibe pinned in a venv of its
own (make agents-py, under .venv-agents/vibe) instead of uv and a download.

Everything but install() is harbor's own Vibe: `vibe --auto-approve --trust --output text
--prompt=...`, its output in agent/vibe.txt, its config.toml (telemetry, update checks and
notifications off) and session transcript under agent/vibe-home/. The backend is harbor's
`generic` one (OpenAI chat completions at OPENAI_BASE_URL, the key from OPENAI_API_KEY), not
Mistral's API.

Load it by import path `wharf.collect.agents.vibe:LocalVibe`.
"""
from __future__ import annotations

from typing import Any

from harbor.agents.installed.vibe import Vibe

from wharf.collect.agents import py_clis
from wharf.collect.agents.pinned import Pinned


class LocalVibe(Pinned, Vibe):
    agent_name, binary, clis = "vibe", "vibe", py_clis
    options_model = py_clis.endpoint_options(Vibe.options_model)

    def __init__(self, *args: Any, extra_env: dict[str, str] | None = None, backend: str | None = "generic",
                 **kwargs: Any) -> None:
        super().__init__(*args, backend=backend, extra_env={**py_clis.cli_env(kwargs), **(extra_env or {})}, **kwargs)
