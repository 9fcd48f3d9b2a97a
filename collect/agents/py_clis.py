"""The Python agent CLIs (aider, mistral-vibe), each pinned in a venv of its own under .venv-agents/
(`make agents-py`): their exact pins would clash with wharf's and with each other's.

The sandbox sees the project read-only; the harbor agent classes built on these
(collect/agents/aider.py, vibe.py) put .venv-agents/bin first on PATH. That dir holds only the CLIs'
entry points, so the venvs' own python never shadows the task's.
"""
from __future__ import annotations

import shlex
from pathlib import Path

from collect.agents.node_clis import SANDBOX_PATH, CliMissing

ROOT = Path(__file__).resolve().parents[2] / ".venv-agents"
BIN_DIR = ROOT / "bin"
# CLI -> the pip requirement its venv (ROOT/<cli>) installs; the Makefile's agents-py pins the same.
PINS = {"aider": "aider-chat==0.86.2", "vibe": "mistral-vibe==2.26.1"}


def cli(name: str) -> Path:
    """The CLI's entry point; CliMissing naming the fix when it is absent."""
    path = BIN_DIR / name
    if not path.exists():
        raise CliMissing(f"{name} CLI not found at {path}: run `make agents-py` (pip installs {PINS[name]} "
                         f"into {ROOT / name})")
    return path


def cli_env(kwargs: dict | None = None) -> dict[str, str]:
    """PATH with the CLIs first, and the endpoint kwargs wharf gives its own agents (base_url,
    api_key) as the OpenAI variables these CLIs read."""
    env = {"PATH": f"{BIN_DIR}:{SANDBOX_PATH}"}
    if (kwargs or {}).get("base_url"):
        env["OPENAI_BASE_URL"] = env["OPENAI_API_BASE"] = kwargs["base_url"]
    if (kwargs or {}).get("api_key"):
        env["OPENAI_API_KEY"] = kwargs["api_key"]
    return env


def endpoint_options(options_model):
    """harbor's options model of an agent, plus the endpoint kwargs wharf gives its own agents."""
    from pydantic import Field, create_model

    return create_model(f"Local{options_model.__name__}", __base__=options_model,
                        base_url=(str | None, Field(default=None, description="the rollout's base URL (.../v1)")),
                        api_key=(str | None, Field(default=None, description="API key (any string the proxy accepts)")))


def install_check(name: str) -> str:
    path = shlex.quote(str(cli(name)))
    return f'test -x {path} || {{ echo "{path} is not visible in the sandbox" >&2; exit 1; }}'
