"""Find harbor task dirs in a dataset path and plan the rollouts of one round."""
from __future__ import annotations

import secrets
import zlib
from dataclasses import dataclass
from pathlib import Path

from wharf.tasks.judges import check_task
from wharf.core import bundled
from wharf.core.errors import WharfError


class TaskSetError(WharfError, ValueError):
    """A dataset path that holds no usable harbor task: a bad config value, exit 2."""

    exit_code = 2


@dataclass(frozen=True)
class Task:
    task_id: str
    path: Path


@dataclass(frozen=True)
class PlannedRollout:
    task: Task
    attempt: int

    @property
    def group_id(self) -> str:
        return self.task.task_id


def discover(dataset: str | Path, only: list[str] | None = None) -> list[Task]:
    """A task dir (has task.toml) or a directory of task dirs; `only` keeps the named tasks."""
    root = Path(dataset)
    if not root.is_dir():
        carries = ", ".join(f"datasets/{p.name}" for p in sorted((bundled.DATA / "datasets").iterdir()))
        where = "" if root.is_absolute() else f" (read from {Path.cwd()}; wharf itself carries {carries})"
        raise TaskSetError(f"collect.dataset: {root} is not a directory of harbor tasks{where}")
    if (root / "task.toml").is_file():
        tasks = [Task(root.name, root.resolve())]
    else:
        tasks = [Task(p.name, p.resolve()) for p in sorted(root.iterdir()) if (p / "task.toml").is_file()]
    if not tasks:
        raise TaskSetError(f"collect.dataset: {root} holds no task dir (a folder with task.toml)")
    if only:
        known = {t.task_id for t in tasks}
        unknown = [name for name in only if name not in known]
        if unknown:
            raise TaskSetError(
                f"collect.tasks: {unknown} not found in {root}; known tasks: {sorted(known)}"
            )
        tasks = [t for t in tasks if t.task_id in set(only)]
    for t in tasks:  # a task whose judge lacks its files fails here, before any rollout starts
        check_task(t.path)
    return tasks


def plan(tasks: list[Task], attempts: int) -> list[PlannedRollout]:
    if attempts < 1:
        raise TaskSetError(f"collect.attempts must be >= 1, got {attempts}")
    return [PlannedRollout(t, a) for t in tasks for a in range(attempts)]


def new_rollout_id(job_id: str, planned: PlannedRollout) -> str:
    """Unique per try: a rollout redone after a crash gets a fresh id, so turns recorded for the
    abandoned try can never mix with the new one's. 128 random bits: not guessable either."""
    return f"{job_id[:8]}.{planned.task.task_id}.{planned.attempt}.{secrets.token_hex(16)}"


def rollout_seed(base: int | None, round_: int, planned: PlannedRollout) -> int | None:
    """The same (task, attempt) of the same round gets the same seed on every run, whichever
    try or order it runs in; the proxy adds the call's turn to it."""
    if base is None:
        return None
    return zlib.crc32(f"{base}:{round_}:{planned.task.task_id}:{planned.attempt}".encode()) % 2**30
