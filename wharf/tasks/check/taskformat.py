"""A harbor task dir's format, checked before any trial: every mistake is one line naming the
file (and the field) and what to do.

    task.toml        [metadata] judge (checker | contest | pytest; pytest when absent),
                     [environment] workdir (default /app)
    instruction.md   what the agent is told (not empty)
    environment/     the workspace's files (no Dockerfile: the bwrap sandbox cannot build one)
    tests/test.sh    the verifier; runs the judge task.toml names
    tests/spec.json  FAIL_TO_PASS (a non-empty list of test ids) and PASS_TO_PASS (a list), no id
                     in both; needed by every judge but a task's own (SWE-Gym's test.sh)
    solution/        the oracle: solve.sh, or one reverse patch (*.patch / *.diff) to `git apply`
"""
from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

from wharf.core.errors import WharfError
from wharf.tasks.judges import TaskJudgeError, check_task as judged

DEFAULT_WORKDIR = "/app"
PATCH_SUFFIXES = (".patch", ".diff")


class TaskFormatError(WharfError, ValueError):
    """A task dir that is not a well-formed harbor task (bad input: exit 2)."""


@dataclass(frozen=True)
class TaskFormat:
    """What the checker needs to know of a well-formed task dir."""

    path: Path
    judge: str  # checker | contest | pytest
    workdir: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    oracle: str  # "solve.sh", or the reverse patch's file name in solution/


def _toml(task: Path) -> dict:
    path = task / "task.toml"
    if not path.is_file():
        raise TaskFormatError(f"{path}: missing; a harbor task dir holds task.toml, instruction.md, environment/, tests/")
    try:
        return tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise TaskFormatError(f"{path}: not valid TOML ({e})") from None


def _workdir(task: Path, toml: dict) -> str:
    env = toml.get("environment", {})
    workdir = env.get("workdir", DEFAULT_WORKDIR) if isinstance(env, dict) else None
    if not isinstance(workdir, str) or not workdir.startswith("/"):
        raise TaskFormatError(f"{task / 'task.toml'}: [environment] workdir must be an absolute path, e.g. \"/app\"")
    return workdir


def _ids(spec_path: Path, spec: dict, key: str, nonempty: bool) -> tuple[str, ...]:
    value = spec.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise TaskFormatError(f"{spec_path}: {key} must be a list of test ids (strings), got {json.dumps(value)[:80]}")
    if nonempty and not value:
        raise TaskFormatError(f"{spec_path}: {key} is empty; name the test(s) the fix makes pass")
    return tuple(value)


def read_spec(task: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """tests/spec.json's (FAIL_TO_PASS, PASS_TO_PASS), checked."""
    path = task / "tests" / "spec.json"
    try:
        spec = json.loads(path.read_text())
    except FileNotFoundError:
        raise TaskFormatError(f"{path}: missing; it names FAIL_TO_PASS and PASS_TO_PASS") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TaskFormatError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(spec, dict):
        raise TaskFormatError(f"{path}: must be a JSON object with FAIL_TO_PASS and PASS_TO_PASS")
    f2p, p2p = _ids(path, spec, "FAIL_TO_PASS", True), _ids(path, spec, "PASS_TO_PASS", False)
    both = sorted(set(f2p) & set(p2p))
    if both:
        raise TaskFormatError(f"{path}: FAIL_TO_PASS and PASS_TO_PASS both name {both[0]!r}; a test is in one")
    return f2p, p2p


def oracle_of(task: Path) -> str:
    """solution/'s oracle: solve.sh, else its one reverse patch."""
    sol = task / "solution"
    if (sol / "solve.sh").is_file():
        return "solve.sh"
    patches = sorted(p.name for p in sol.glob("*") if p.is_file() and p.suffix in PATCH_SUFFIXES) if sol.is_dir() else []
    if len(patches) == 1:
        return patches[0]
    why = f"holds {len(patches)} patches ({', '.join(patches)})" if patches else "holds neither solve.sh nor a *.patch"
    raise TaskFormatError(f"{sol}: {why}; the oracle is solution/solve.sh or one reverse patch")


def read_task(task: Path) -> TaskFormat:
    """The checked format of `task`, or TaskFormatError with one line."""
    task = Path(task)
    if not task.is_dir():
        raise TaskFormatError(f"{task}: not a directory")
    toml = _toml(task)
    workdir = _workdir(task, toml)
    instruction = task / "instruction.md"
    if not instruction.is_file() or not instruction.read_text(errors="replace").strip():
        raise TaskFormatError(f"{instruction}: missing or empty; it is what the agent is told")
    env = task / "environment"
    if not env.is_dir():
        raise TaskFormatError(f"{env}: missing; it holds the workspace's files")
    if (env / "Dockerfile").exists():
        raise TaskFormatError(f"{env / 'Dockerfile'}: a Docker task; tasks check runs tasks in the bwrap "
                              "sandbox, which cannot build images (ship the files in environment/)")
    if not (task / "tests" / "test.sh").is_file():
        raise TaskFormatError(f"{task / 'tests' / 'test.sh'}: missing; it runs the judge")
    try:
        judge = judged(task).kind
    except TaskJudgeError as e:
        raise TaskFormatError(str(e)) from None
    f2p, p2p = read_spec(task)
    return TaskFormat(task, judge, workdir, f2p, p2p, oracle_of(task))


def task_dirs(paths: list[Path]) -> list[Path]:
    """The task dirs `paths` name: each a task dir (it has task.toml), or a dir of them."""
    out: list[Path] = []
    for p in map(Path, paths):
        kids = sorted(k for k in p.iterdir() if (k / "task.toml").is_file()) if p.is_dir() else []
        out.extend([p] if (p / "task.toml").exists() or not kids else kids)
    return out
