"""Whose fault a failed trial on a Ray node is: its task's or its node's. Pure bookkeeping that
the dispatch (wharf/collect/ray_dispatch.py) asks after every answer.

A failure alone says nothing: a task that fails the same way everywhere (a broken task dir, a
verifier that crashes) would otherwise take out every node in turn. So:

- a node is retired when a task that failed on it succeeds on another node, or when two
  different tasks failed on it that failed nowhere else;
- a task is given up (its trials not run this round) when it failed on two nodes and succeeded
  on none, or on every node left (one, on a one-node cluster);
- a failed trial never goes back to a node its task failed on.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Blame:
    failed_on: dict[str, set[str]] = field(default_factory=dict)  # task -> nodes it failed on
    succeeded_on: dict[str, set[str]] = field(default_factory=dict)  # task -> nodes it succeeded on
    given_up: dict[str, str] = field(default_factory=dict)  # task -> why its trials are not run

    def may_run(self, task: str, node: str) -> bool:
        return task not in self.given_up and node not in self.failed_on.get(task, ())

    def failure(self, task: str, node: str) -> str | None:
        """Record that `task` failed on `node`; returns why the node is to be retired, or None."""
        self.failed_on.setdefault(task, set()).add(node)
        elsewhere = sorted(self.succeeded_on.get(task, set()) - {node})
        if elsewhere:
            return f"its trial of {task} failed; {task} succeeded on {elsewhere[0]}"
        only_here = sorted(t for t, nodes in self.failed_on.items() if nodes == {node})
        if len(only_here) >= 2:
            return f"two different tasks failed on it and nowhere else ({', '.join(only_here[:2])})"
        return None

    def success(self, task: str, node: str) -> dict[str, str]:
        """Record that `task` succeeded on `node`; returns {node: why} of the nodes it failed on."""
        self.succeeded_on.setdefault(task, set()).add(node)
        return {n: f"its trial of {task} failed; {task} succeeded on {node}"
                for n in sorted(self.failed_on.get(task, set()) - {node})}

    def give_up(self, task: str, live: set[str]) -> str | None:
        """Why `task` is given up now that it failed again (None: it runs again on a node left)."""
        if task in self.given_up:
            return self.given_up[task]
        if self.succeeded_on.get(task):
            return None
        failed = self.failed_on.get(task, set())
        if len(failed) >= 2 or (live and live <= failed):
            self.given_up[task] = f"failed on {len(failed)} node(s) ({', '.join(sorted(failed))}) and succeeded on none"
            return self.given_up[task]
        return None
