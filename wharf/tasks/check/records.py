"""The typed records across the checker's seams: what a trial does to the workspace (Change), what
the judge said (Trial), and the verdict on a task (TaskVerdict), with its report forms."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Awaitable, Callable

from wharf.tasks.check.taskformat import TaskFormat

TIERS = ("format", "judge", "tier1", "tier2")  # the stages whose seconds a verdict records


@dataclass(frozen=True)
class Change:
    """What a scripted agent does in the workspace before the judge runs.

    oracle  upload solution/ and run it (solve.sh, or `git apply` of its reverse patch)
    files   {path relative to the workdir: new text} written as the agent's change
    steps   shell steps (str.format templates over the red team's facts), run in order"""

    name: str
    oracle: bool = False
    files: dict[str, str] = field(default_factory=dict)
    steps: tuple[str, ...] = ()
    run: int = 0  # which repetition (oracle and nop run several times)
    tier: str = "judge"  # judge | tier1 | tier2
    test_timeout: int | None = None  # WHARF_TEST_TIMEOUT for the judge (None: the task's own)


@dataclass(frozen=True)
class Trial:
    """One judged trial: the reward the judge wrote (None: no usable reward) and why not."""

    change: str
    reward: float | None
    error: str | None = None
    seconds: float = 0.0
    diff: str = ""  # the workspace's `git diff` after the agent (the oracle's change)
    rewards: dict = field(default_factory=dict)
    output: str = ""  # what the agent's steps printed (for the red team's leak check)
    run: int = 0
    tier: str = "judge"


# The checker's one way to the judge: run these changes as trials of the task, return their trials.
Grade = Callable[[TaskFormat, list[Change]], Awaitable[list[Trial]]]


@dataclass
class TaskVerdict:
    """The check of one task dir: ok, or the reasons it failed; seconds per tier."""

    task: str
    ok: bool
    reasons: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    judge: str = ""
    notes: list[str] = field(default_factory=list)  # what the check could not try (no exploit applies)
    trials: list[Trial] = field(default_factory=list)

    def fail(self, reason: str) -> None:
        self.ok = False
        self.reasons.append(reason)

    def line(self) -> str:
        """One line: the task, ok or FAILED with the first reason, and the seconds per tier."""
        times = " ".join(f"{t} {self.seconds[t]:.1f}s" for t in TIERS if t in self.seconds)
        head = ("ok" + (f" ({'; '.join(self.notes)})" if self.notes else "")) if self.ok else f"FAILED: {self.reasons[0]}" + (
            f" (+{len(self.reasons) - 1} more)" if len(self.reasons) > 1 else "")
        return f"{self.task}: {head}  [{times}]"

    def to_json(self) -> dict:
        d = asdict(self)
        d["trials"] = [{k: v for k, v in asdict(t).items() if k != "output" and (v or k in ("reward", "run", "tier"))}
                       for t in self.trials]
        return d
