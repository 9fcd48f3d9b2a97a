"""The Python agent CLIs (aider, mistral-vibe, openhands), each pinned in a venv of its own under .venv-agents/
(`make agents-py`): their exact pins would clash with wharf's and with each other's.

The sandbox sees the project read-only; the harbor agent classes built on these
(wharf/collect/agents/aider.py, vibe.py) put .venv-agents/bin first on PATH. That dir holds only the CLIs'
entry points, so the venvs' own python never shadows the task's. openhands has no entry point
there: harbor's run() calls its venv's python at a fixed path (wharf/collect/agents/openhands.py).
"""
from __future__ import annotations

import shlex
from pathlib import Path

from wharf.collect.agents.node_clis import SANDBOX_PATH, CliMissing

ROOT = Path(__file__).resolve().parents[3] / ".venv-agents"
BIN_DIR = ROOT / "bin"
# CLI -> the pip requirement its venv (ROOT/<cli>) installs; the Makefile's agents-py pins the same.
PINS = {"aider": "aider-chat==0.86.2", "vibe": "mistral-vibe==2.26.1", "openhands": "openhands-ai==1.6.0"}


def cli(name: str) -> Path:
    """The CLI's entry point; CliMissing naming the fix when it is absent."""
    return _present(name, BIN_DIR / name)


def venv_python(name: str) -> Path:
    """The python of the CLI's own venv; CliMissing naming the fix when it is absent."""
    return _present(name, ROOT / name / "bin" / "python")


def _present(name: str, path: Path) -> Path:
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
    return visible_check(cli(name))


def visible_check(path: Path | str) -> str:
    """A shell command that fails naming the path when the sandbox cannot run it."""
    q = shlex.quote(str(path))
    return f'test -x {q} || {{ echo "{q} is not visible in the sandbox" >&2; exit 1; }}'
