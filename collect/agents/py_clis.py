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


def cli_env() -> dict[str, str]:
    return {"PATH": f"{BIN_DIR}:{SANDBOX_PATH}"}


def install_check(name: str) -> str:
    path = shlex.quote(str(cli(name)))
    return f'test -x {path} || {{ echo "{path} is not visible in the sandbox" >&2; exit 1; }}'
