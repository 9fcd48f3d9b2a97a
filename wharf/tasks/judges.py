"""Which judge grades a task, as the task format says it: task.toml's `[metadata] judge`.

  checker  state-checking tasks (datasets/learn, datasets/multiturn, the toy write-* tasks):
           tests/check.py reads the workspace the agent left, from outside it; tests/test.sh
           runs wharf/tasks/tools/judge.sh checker.
  contest  function tasks (the toy fix-* and sed-* tasks): tests/contest.py holds the reference
           and the input generators; tests/test.sh runs wharf/tasks/tools/judge.sh contest.
  pytest   SWE-style repositories whose own test suite decides: tests/test.sh runs
           wharf/tasks/tools/grade_pytest.sh (the hardened in-process run), or a SWE-Gym test.sh.

A task without the key is a pytest task (SWE-Gym task dirs, tasks written before judges had
kinds). docs/judges.md says what each kind guarantees.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from wharf.core.errors import WharfError

DEFAULT = "pytest"


class TaskJudgeError(WharfError, ValueError):
    """A task dir whose judge is unknown or lacks what its judge needs."""


@dataclass(frozen=True)
class Judge:
    kind: str
    files: tuple[str, ...]  # what tests/ must hold
    call: str | None  # what tests/test.sh must run (None: a task's own grader, e.g. SWE-Gym's)


JUDGES = {
    "checker": Judge("checker", ("spec.json", "check.py"), '/judge.sh" checker'),
    "contest": Judge("contest", ("spec.json", "contest.py"), '/judge.sh" contest'),
    "pytest": Judge("pytest", (), None),
}


def judge_of(task: Path) -> Judge:
    """The judge task.toml names (pytest when it names none)."""
    toml = Path(task) / "task.toml"
    try:
        meta = tomllib.loads(toml.read_text()).get("metadata", {})
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise TaskJudgeError(f"{toml}: cannot read it ({e})") from e
    kind = meta.get("judge", DEFAULT)
    if kind not in JUDGES:
        raise TaskJudgeError(f"{toml}: [metadata] judge = {kind!r} is not a judge; use one of {sorted(JUDGES)}")
    return JUDGES[kind]


def check_task(task: Path) -> Judge:
    """The task's judge, after checking that tests/ holds its files and test.sh runs it."""
    judge, tests = judge_of(task), Path(task) / "tests"
    missing = [f for f in judge.files if not (tests / f).is_file()]
    if missing:
        raise TaskJudgeError(f"{task}: the {judge.kind} judge needs tests/{', tests/'.join(missing)}")
    script = (tests / "test.sh").read_text() if (tests / "test.sh").is_file() else ""
    if judge.call is not None and judge.call not in script:
        raise TaskJudgeError(f"{task}: tests/test.sh must run wharf/tasks/tools/judge.sh {judge.kind} "
                             f"(\"${{WHARF_TASK_TOOLS:-/tests}}/judge.sh\" {judge.kind} /app)")
    return judge
