"""The checker's way to the judge: each Change a real harbor trial of the task in the bwrap
sandbox (the path every collect trial takes), its agent the scripted CheckAgent. The red team's
facts (a host process, a host file) come from a World that lives as long as the check."""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from wharf.collect.trials import primary_reward
from wharf.tasks.check.records import Change, Trial
from wharf.tasks.check.taskformat import TaskFormat

AGENT = "wharf.pipeline.taskcheck.agent:CheckAgent"
BWRAP = "wharf.collect.sandbox.bwrap:BwrapEnvironment"


@dataclass
class World:
    """What the red team's sandbox attackers aim at on the host: a process holding a secret and a
    file path they must not write. Unreachable ports stand in for the proxy and the engine (tasks
    check runs no proxy: those attackers are collect's, in tests/test_redteam.py)."""

    root: Path
    secret: str = field(default_factory=lambda: secrets.token_hex(16))
    proc: subprocess.Popen | None = None

    def __enter__(self) -> "World":
        (self.root / "host").mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(["sleep", "86400"], env={"WHARF_SECRET": self.secret, "PATH": os.defpath})
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    @property
    def host_file(self) -> Path:
        return self.root / "host" / "pwned"

    def facts(self) -> dict:
        return {"host_pid": self.proc.pid if self.proc else 1, "host_file": str(self.host_file), "proxy_port": "9",
                "admin_port": "9", "engine_port": "9", "victim": "victim", "own": "own", "admin_token": "x",
                "repo": "/nonexistent"}

    def harmed(self) -> str | None:
        """What an attacker did to the host, or None."""
        if self.host_file.exists():
            return f"a host file was written from the sandbox ({self.host_file})"
        if self.proc is not None and self.proc.poll() is not None:
            return "a host process was killed from the sandbox"
        return None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _outcome(change: Change, result, trial_dir: Path, seconds: float) -> Trial:
    rewards = dict(result.verifier_result.rewards or {}) if result.verifier_result else {}
    reward = primary_reward(rewards) if rewards else None
    exc = result.exception_info
    error = f"{exc.exception_type}: {exc.exception_message}"[:1000] if exc else None
    if reward is None and error is None:
        error = f"the verifier wrote no usable reward: {json.dumps(rewards)[:300]}"
    steps = json.loads(_read(trial_dir / "agent" / "steps.json") or "[]")
    output = "\n".join(s.get("stdout", "") + s.get("stderr", "") + s.get("error", "") for s in steps)
    return Trial(change.name, reward, error, round(seconds, 2), _read(trial_dir / "agent" / "change.diff"),
                 rewards, output, change.run, change.tier)


def env_of(change: Change) -> dict[str, str]:
    """The verifier's env: the task's own, but for a test timeout the change asks for."""
    return {"WHARF_TEST_TIMEOUT": str(change.test_timeout)} if change.test_timeout else {}


class BwrapGrader:
    """grade(task, changes) -> trials, `jobs` at a time, trial dirs under `work` (kept when `keep`)."""

    def __init__(self, work: Path, jobs: int = 4, world: World | None = None):
        self.work = Path(work)
        self.sem = asyncio.Semaphore(max(1, jobs))
        self.world = world

    def _config(self, task: TaskFormat, change: Change, name: str):
        from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig, VerifierConfig

        kwargs: dict = {"files": change.files, "steps": list(change.steps)}
        if change.oracle:
            kwargs.update(solution=str((task.path / "solution").resolve()), oracle=task.oracle)
        if change.steps and self.world is not None:
            kwargs["facts"] = self.world.facts()
        env = {"disk_mb": 64, "pids_max": 256}
        return TrialConfig(task=TaskConfig(path=task.path.resolve()), trial_name=name, trials_dir=self.work / "trials",
                           agent=AgentConfig(import_path=AGENT, kwargs=kwargs),
                           environment=EnvironmentConfig(import_path=BWRAP, kwargs=env),
                           verifier=VerifierConfig(env=env_of(change)))

    async def _one(self, task: TaskFormat, change: Change) -> Trial:
        from harbor.trial.trial import Trial as HarborTrial

        name = f"{task.path.name}__{change.name}-{change.run}-{secrets.token_hex(3)}"
        async with self.sem:
            start = time.monotonic()
            try:
                result = await (await HarborTrial.create(self._config(task, change, name))).run()
            except Exception as e:  # noqa: BLE001 - a trial harbor could not run is that trial's outcome
                return Trial(change.name, None, f"{type(e).__name__}: {e}"[:1000], run=change.run, tier=change.tier)
            return _outcome(change, result, self.work / "trials" / name, time.monotonic() - start)

    async def __call__(self, task: TaskFormat, changes: list[Change]) -> list[Trial]:
        return list(await asyncio.gather(*(self._one(task, c) for c in changes)))
