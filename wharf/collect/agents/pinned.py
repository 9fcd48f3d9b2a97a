"""The shape every wharf wrapper of a harbor CLI agent shares: harbor's own agent class, unchanged
but for install(), which only checks that the CLI pinned here (make agents, make agents-py) is
visible in the sandbox instead of downloading it.

    class LocalVibe(Pinned, Vibe):
        agent_name, binary, clis = "vibe", "vibe", py_clis

Pinned comes first, so its name(), install() and get_version_command() win over harbor's.
"""
from __future__ import annotations

from types import ModuleType
from typing import ClassVar

from harbor.environments.base import BaseEnvironment


class Pinned:
    agent_name: ClassVar[str]  # harbor knows the wrapper as wharf-<agent_name>
    binary: ClassVar[str]  # the CLI's entry point
    clis: ClassVar[ModuleType]  # node_clis or py_clis: where the pinned CLIs are (cli, install_check)

    @classmethod
    def name(cls) -> str:
        return f"wharf-{cls.agent_name}"

    def get_version_command(self) -> str | None:
        return f"{self.clis.cli(self.binary)} --version"

    def install_command(self) -> str:
        """The shell command install() runs in the sandbox; it fails naming the missing path."""
        return self.clis.install_check(self.binary)

    async def install(self, environment: BaseEnvironment) -> None:
        await self.exec_as_agent(environment, command=self.install_command())
