"""harbor's OpenHands agent, offline: openhands-ai pinned in a venv of its own (make agents-py,
under .venv-agents/openhands) instead of uv, a Python download and an install into /opt.

Everything but install() is harbor's own OpenHands: `/opt/openhands-venv/bin/python -m
openhands.core.main --task=...` on its local runtime, its output in agent/openhands.txt, its
event store under agent/sessions/, and every LLM call logged by OpenHands itself in
agent/completions/ (one JSON file per call: the log the rows are checked against). The bubblewrap
sandbox shows the venv read-only at /opt/openhands-venv, the path harbor's run() calls
(wharf/collect/sandbox/bwrap.py); it runs there by `python -m`, so the venv's own scripts, which name
its host path, are not needed.

Load it by import path `wharf.collect.agents.openhands:LocalOpenHands`.
"""
from __future__ import annotations

from typing import Any

from harbor.agents.installed.openhands import OpenHands

from wharf.collect.agents import py_clis
from wharf.collect.agents.pinned import Pinned

SANDBOX_VENV = "/opt/openhands-venv"  # where harbor's run() calls it


class LocalOpenHands(Pinned, OpenHands):
    agent_name, binary, clis = "openhands", "openhands", py_clis
    options_model = py_clis.endpoint_options(OpenHands.options_model)

    def __init__(self, *args: Any, extra_env: dict[str, str] | None = None, **kwargs: Any) -> None:
        env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # litellm would fetch its price list
        if kwargs.get("base_url"):
            env["LLM_BASE_URL"] = kwargs["base_url"]
        if kwargs.get("api_key"):
            env["LLM_API_KEY"] = kwargs["api_key"]
        super().__init__(*args, extra_env={**env, **(extra_env or {})}, **kwargs)

    def get_version_command(self) -> str | None:
        return OpenHands.get_version_command(self)  # harbor's: it runs in the sandbox

    def install_command(self) -> str:
        py_clis.venv_python("openhands")  # absent on the host: CliMissing naming make agents-py
        return py_clis.visible_check(f"{SANDBOX_VENV}/bin/python")
