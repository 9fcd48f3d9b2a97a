"""harbor's mini-swe-agent, offline: the project venv's `mini-swe-agent` CLI instead of a download.

harbor's built-in MiniSweAgent installs uv and mini-swe-agent from the internet in setup(). Here
the CLI is already installed (mini-swe-agent in the venv), and the sandbox sees the venv read-only,
so install() only links the CLI to $HOME/.local/bin, which is where the built-in run() looks for it.
Everything else (the command line, the ATIF conversion) is harbor's own.

Load it by import path `wharf.collect.agents.mini_swe:LocalMiniSweAgent` with the model name
`openai/<served name>`. Extra kwargs on top of harbor's mini-swe-agent options:
  base_url, api_key   the endpoint (else OPENAI_BASE_URL / OPENAI_API_KEY from the agent env)
  textbased           True (default): mini_textbased.yaml with the litellm_textbased model class
                      (```mswea_bash_command blocks, no tool calling);
                      False: mini.yaml with tool calls
  step_limit          model calls at most (0: unlimited)
The sandbox must expose the venv's path (BwrapEnvironment does: host dirs are bound read-only).
"""
from __future__ import annotations

import os
import importlib.util
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml
from harbor.agents.installed.mini_swe_agent import MiniSweAgent, MiniSweAgentOptions
from harbor.environments.base import BaseEnvironment
from pydantic import Field


class LocalMiniSweAgentOptions(MiniSweAgentOptions):
    base_url: str | None = Field(default=None, description="OpenAI base URL (.../v1)")
    api_key: str | None = Field(default=None, description="API key")
    textbased: bool = Field(default=True, description="text-based action blocks instead of tool calls")
    step_limit: int = Field(default=0, ge=0, description="model calls at most (0: unlimited)")


def mini_cli() -> Path:
    """The mini-swe-agent CLI next to this interpreter (the venv), else on PATH."""
    # real path: a sandbox shows the venv at its real path only
    here = Path(os.path.realpath(Path(sys.executable).parent)) / "mini-swe-agent"
    found = here if here.exists() else (Path(p) if (p := shutil.which("mini-swe-agent")) else None)
    if found is None:
        raise FileNotFoundError("mini-swe-agent CLI not found: pip install mini-swe-agent into the project venv")
    return found


def textbased_config(step_limit: int, api_base: str | None) -> dict[str, Any]:
    """mini_textbased.yaml as shipped, plus the text-based model class (the yaml does not set it)."""
    # Found without importing minisweagent: its import reads the host user's global config.
    spec = importlib.util.find_spec("minisweagent")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("mini-swe-agent is not installed in this interpreter")
    path = Path(spec.submodule_search_locations[0]) / "config" / "mini_textbased.yaml"
    config = yaml.safe_load(path.read_text())
    config.setdefault("model", {})["model_class"] = "litellm_textbased"
    config.setdefault("agent", {})["step_limit"] = step_limit
    if api_base:
        config["model"].setdefault("model_kwargs", {})["api_base"] = api_base
    return config


class LocalMiniSweAgent(MiniSweAgent):
    options_model = LocalMiniSweAgentOptions
    options: LocalMiniSweAgentOptions

    def __init__(self, *args: Any, extra_env: dict[str, str] | None = None, **kwargs: Any) -> None:
        base_url, api_key = kwargs.get("base_url"), kwargs.get("api_key")
        env = dict(extra_env or {})
        if base_url:
            env.update(OPENAI_BASE_URL=base_url, OPENAI_API_BASE=base_url)
        if api_key:
            env.update(OPENAI_API_KEY=api_key, MSWEA_API_KEY=api_key)
        env.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # else litellm waits on the network
        env.setdefault("MSWEA_GLOBAL_CONFIG_DIR", "/tmp/mswea-global")  # per sandbox, not the host's
        env.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
        # The config is built before super().__init__ so harbor writes it into the sandbox.
        # (harbor layers it after `-c mini`, so it wins over mini.yaml.)
        if kwargs.get("config") is None and kwargs.get("config_file") is None:
            api_base = base_url or env.get("OPENAI_BASE_URL")
            step_limit = int(kwargs.get("step_limit", 0))
            if kwargs.get("textbased", True):
                kwargs["config"] = textbased_config(step_limit, api_base)
            else:
                kwargs["config"] = {"agent": {"step_limit": step_limit}}
                if api_base:
                    kwargs["config"]["model"] = {"model_kwargs": {"api_base": api_base}}
        super().__init__(*args, extra_env=env, **kwargs)

    @staticmethod
    def name() -> str:
        return "wharf-mini-swe-agent"

    def get_version_command(self) -> str | None:
        return f"echo mini-swe-agent {_version()}"  # --help would import litellm: seconds

    async def install(self, environment: BaseEnvironment) -> None:
        cli = shlex.quote(str(mini_cli()))
        await self.exec_as_agent(
            environment,
            command=(
                f'test -x {cli} || {{ echo "{cli} is not visible in the sandbox" >&2; exit 1; }}; '
                f'mkdir -p "$HOME/.local/bin" && ln -sf {cli} "$HOME/.local/bin/mini-swe-agent"'
            ),
        )


def _version() -> str:
    from importlib.metadata import version

    return version("mini-swe-agent")
