"""The checker's scripted harbor agent: no model, a fixed change to the workspace, then the usual
verifier. It runs in the same bwrap sandbox and goes through the same agent -> verifier handover
as any agent's trial (so what a real agent could not smuggle past the sandbox, neither can it).

kwargs (all optional; JSON, as harbor's AgentConfig carries them):
    solution  the task's solution/ dir (host path): uploaded to /solution and run as the oracle
    oracle    solve.sh, or the file name of solution/'s reverse patch (`git apply`-ed)
    files     {path relative to the workdir: text} written into the workspace
    steps     shell steps, str.format-ed with `facts`, run in order (the red team's attacks)
What it did lands in its log dir: steps.json (each step's exit code and output) and change.diff
(the workspace's `git diff` against the task's environment/)."""
from __future__ import annotations

import json
import shlex
import tempfile
from pathlib import Path

from harbor.agents.base import BaseAgent

STEP_TIMEOUT_S = 20  # an attacker's step (a fork bomb, a hang) is cut here; the oracle gets ORACLE_TIMEOUT_S
ORACLE_TIMEOUT_S = 600
DIFF = "git add -A >/dev/null 2>&1; git -c core.quotepath=off diff --cached --no-color --no-renames -U0"


class CheckAgent(BaseAgent):
    def __init__(self, *args, solution: str | None = None, oracle: str = "solve.sh", files: dict | None = None,
                 steps: list[str] | None = None, facts: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.solution, self.oracle = solution, oracle
        self.files, self.steps, self.facts = dict(files or {}), list(steps or []), dict(facts or {})

    @staticmethod
    def name() -> str:
        return "wharf-tasks-check"

    def version(self) -> str:
        return "1"

    async def setup(self, environment) -> None:
        pass

    async def _step(self, environment, command: str, log: list[dict], timeout: int = STEP_TIMEOUT_S) -> None:
        try:
            r = await environment.exec(command, timeout_sec=timeout)
            log.append({"command": command[:2000], "rc": r.return_code, "stdout": r.stdout or "", "stderr": r.stderr or ""})
        except Exception as e:  # noqa: BLE001 - a timeout or a killed sandbox is the attack's outcome too
            log.append({"command": command[:2000], "error": f"{type(e).__name__}: {e}"})

    async def run(self, instruction, environment, context) -> None:
        log: list[dict] = []
        if self.solution:
            await environment.upload_dir(self.solution, "/solution")
            run = ("bash /solution/solve.sh" if self.oracle == "solve.sh"
                   else f"git apply {shlex.quote('/solution/' + self.oracle)}")
            await self._step(environment, f"{run} > /logs/agent/oracle.txt 2>&1; echo oracle_rc=$?", log, ORACLE_TIMEOUT_S)
        with tempfile.TemporaryDirectory() as tmp:
            for i, (path, text) in enumerate(self.files.items()):
                src = Path(tmp) / str(i)
                src.write_text(text)
                await environment.upload_file(src, path)
        for script in self.steps:
            await self._step(environment, script.format(**self.facts), log)
        diff = await environment.exec(DIFF, timeout_sec=120)
        Path(self.logs_dir, "change.diff").write_text(diff.stdout or "")
        Path(self.logs_dir, "steps.json").write_text(json.dumps(log, indent=1))
