"""The npm-installed agent CLIs (claude-code, codex, opencode, qwen-code, gemini-cli), pinned in
wharf/collect/agents/node/.

`make agents` installs them there against package-lock.json. The sandbox sees the project
read-only, so the harbor agent classes built on these (wharf/collect/agents/claude_code.py, codex.py,
opencode.py, qwen_code.py, gemini_cli.py) run the CLIs from node_modules/.bin instead of
downloading them, with the network chatter an offline run cannot use switched off.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

NODE_DIR = Path(__file__).resolve().parent / "node"
# real path: the sandbox shows node_modules only there (it may be a link, e.g. in a worktree)
BIN_DIR = Path(os.path.realpath(NODE_DIR / "node_modules")) / ".bin"
# The sandbox's PATH (wharf/collect/sandbox/bwrap.py) with the CLIs in front.
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# npm package of each CLI, for versions and error messages.
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex", "opencode": "opencode-ai",
            "qwen": "@qwen-code/qwen-code", "gemini": "@google/gemini-cli"}


class CliMissing(FileNotFoundError):
    """A pinned CLI that `make agents` has not installed."""


def cli(name: str) -> Path:
    """The CLI's entry in node_modules/.bin; CliMissing naming the fix when it is absent."""
    path = BIN_DIR / name
    if not path.exists():
        raise CliMissing(f"{name} CLI not found at {path}: run `make agents` "
                         f"(npm install in {NODE_DIR}, pins {PACKAGES.get(name, name)})")
    return path


def pinned_version(name: str) -> str:
    """The version package.json pins for the CLI."""
    deps = json.loads((NODE_DIR / "package.json").read_text())["dependencies"]
    return deps[PACKAGES[name]]


def cli_env() -> dict[str, str]:
    """PATH with the pinned CLIs first (harbor's run() calls them by bare name)."""
    return {"PATH": f"{BIN_DIR}:{SANDBOX_PATH}"}


def route_root(base_url: str) -> str:
    """The rollout's route without its /v1, for CLIs that append their API's own version path
    (claude-code's /v1/messages, gemini-cli's /v1beta/models/...)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def install_check(name: str, link_as: str | None = None) -> str:
    """A shell command that fails clearly when the sandbox cannot see the CLI; optionally links it
    into $HOME/.local/bin (where harbor's claude-code run() looks)."""
    import shlex

    path = shlex.quote(str(cli(name)))
    cmd = f'test -x {path} || {{ echo "{path} is not visible in the sandbox" >&2; exit 1; }}'
    if link_as:
        cmd += f'; mkdir -p "$HOME/.local/bin" && ln -sf {path} "$HOME/.local/bin/{link_as}"'
    return cmd
