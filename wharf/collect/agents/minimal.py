"""MinimalAgent: a shell agent small enough for SmolLM2-135M-Instruct to drive sometimes.

It runs in the harbor process (like terminus-2) and drives the sandbox through env.exec:
ask the model, pull one shell command out of the answer, run it, show the output, repeat,
until the model says DONE or the turn limit is reached. The prompt is short and carries one
worked example; the command extraction is lenient (a fenced block with any tag, even unclosed,
a `$ cmd` line, or a line that starts with a common command), because a 135M model rarely
follows a format exactly (behind mini-swe-agent it solved 0 of 28 runs, nearly all ended by three
format errors in a row).

Load it by import path `wharf.collect.agents.minimal:MinimalAgent`. kwargs (AgentConfig.kwargs):
base_url (else OPENAI_BASE_URL), api_key (else OPENAI_API_KEY, else "EMPTY"), max_turns,
max_tokens, temperature (omitted from requests unless set: the proxy forces it), command
timeout, output truncation. The model name is AgentConfig.model_name.

It writes `trajectory.json` in its logs dir after every model call: each call's request
messages and the assistant text, in order, so the collect runner can match the recorded proxy
rows one to one. The client never retries (a retry would add a proxy row the trajectory does
not have), and an endpoint error ends the run with an exception (an agent error, not a
silent success).
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from harbor.agents.base import BaseAgent
from harbor.agents.options import AgentOptions
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext
from pydantic import Field

from wharf.core import atomic

DONE_MARKERS = ("DONE", "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
TRAJECTORY_FORMAT = "wharf-minimal/1"

SYSTEM = (
    "You solve tasks in a Linux shell. Reply with exactly one shell command in a ```bash block. "
    "You will see its output. When the task is done, reply DONE."
)
# One worked example: the model copies the command the instruction gives, then says DONE.
EXAMPLE = [
    {"role": "user", "content": "Task: In util.py the function inc returns n - 1.\n"
     "Run this command to fix it:\n\nsed -i 's/n - 1/n + 1/' util.py"},
    {"role": "assistant", "content": "```bash\nsed -i 's/n - 1/n + 1/' util.py\n```"},
    {"role": "user", "content": "Exit code 0. No output."},
    {"role": "assistant", "content": "DONE"},
]
NO_COMMAND = "No command found. Reply with one command in a ```bash block, or DONE if the task is done."

# Lines a small model writes bare, without a fence: take them as commands.
_COMMON = {
    "echo", "printf", "sed", "cat", "python", "python3", "ls", "cd", "grep", "touch", "mv", "cp",
    "mkdir", "rm", "find", "head", "tail", "awk", "git", "pytest", "pip", "chmod", "tee",
}
_FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.S)


class MinimalAgentOptions(AgentOptions):
    base_url: str | None = Field(default=None, description="OpenAI base URL (.../v1); else OPENAI_BASE_URL")
    api_key: str | None = Field(default=None, description="API key; else OPENAI_API_KEY, else EMPTY")
    max_turns: int = Field(default=4, ge=1, description="model calls at most")
    max_tokens: int = Field(default=128, ge=1, description="max_tokens of each call")
    temperature: float | None = Field(default=None, description="sent only when set")
    command_timeout_sec: int = Field(default=60, ge=1, description="per command")
    max_output_chars: int = Field(default=600, ge=50, description="command output shown to the model")
    request_timeout_sec: float = Field(default=900.0, gt=0, description="per model call")


def extract_command(text: str) -> str | None:
    """The shell command in a model answer, or None. Lenient on purpose (see the module doc)."""
    m = _FENCE.search(text)
    if m:
        body = "\n".join(line.removeprefix("$ ") for line in m.group(1).strip("\n").splitlines())
        return body.strip() or None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("$ ") and stripped[2:].strip():
            return stripped[2:].strip()
    for line in text.splitlines():
        stripped = line.strip().strip("`").strip()
        if stripped.split(" ", 1)[0] in _COMMON:
            return stripped
    return None


def is_done(text: str) -> bool:
    return any(re.search(rf"\b{m}\b", text) for m in DONE_MARKERS)


def observation(exit_code: int | None, stdout: str | None, stderr: str | None, limit: int) -> str:
    out = (stdout or "") + (stderr or "")
    if exit_code is None:
        head = "The command timed out."
    else:
        head = f"Exit code {exit_code}."
    if not out.strip():
        return f"{head} No output."
    if len(out) > limit:
        out = out[: limit // 2] + "\n[... output truncated ...]\n" + out[-limit // 2 :]
    return f"{head} Output:\n{out}"


class MinimalAgent(BaseAgent):
    options_model = MinimalAgentOptions
    options: MinimalAgentOptions

    @staticmethod
    def name() -> str:
        return "wharf-minimal"

    def version(self) -> str:
        return "0.1.0"

    async def setup(self, environment: BaseEnvironment) -> None:
        pass  # nothing to install: it runs in the harbor process

    def _endpoint(self) -> tuple[str, str]:
        base_url = self.options.base_url or self._get_env("OPENAI_BASE_URL", "OPENAI_API_BASE")
        if not base_url:
            raise ValueError(
                f"{self.name()}: no endpoint: pass kwargs base_url=http://HOST:PORT/v1 or set OPENAI_BASE_URL"
            )
        api_key = self.options.api_key or self._get_env("OPENAI_API_KEY") or "EMPTY"
        return base_url, api_key

    def _trajectory(self, instruction: str, base_url: str) -> dict[str, Any]:
        return {
            "format": TRAJECTORY_FORMAT,
            "agent": self.name(),
            "version": self.version(),
            "model": self.model_name,
            "base_url": base_url,
            "instruction": instruction,
            "calls": [],
            "stop_reason": None,
        }

    async def _ask(self, client, messages: list[dict], turn: int, traj: dict,
                   context: AgentContext) -> tuple[str, dict]:
        """One model call, recorded in the trajectory (its token counts in the context)."""
        import openai

        opts = self.options
        request: dict[str, Any] = {"model": self.model_name, "messages": list(messages), "max_tokens": opts.max_tokens}
        if opts.temperature is not None:
            request["temperature"] = opts.temperature
        call: dict[str, Any] = {"turn": turn, "messages": request["messages"], "started_at": time.time()}
        traj["calls"].append(call)
        try:
            response = await client.chat.completions.create(**request)
        except openai.OpenAIError as e:
            call["error"] = f"{type(e).__name__}: {e}"
            traj["stop_reason"] = "endpoint_error"
            raise RuntimeError(f"{self.name()}: model call {turn} to {traj['base_url']} failed: {e}") from e
        choice = response.choices[0]
        text = choice.message.content or ""
        call.update(assistant=text, finish_reason=choice.finish_reason, ended_at=time.time())
        if response.usage is not None:
            call["usage"] = response.usage.model_dump()
            context.n_input_tokens += response.usage.prompt_tokens or 0
            context.n_output_tokens += response.usage.completion_tokens or 0
        return text, call

    async def _act(self, environment: BaseEnvironment, command: str, call: dict) -> str:
        """Run the command in the sandbox; the observation the model is shown next."""
        opts = self.options
        call["command"] = command
        try:
            result = await environment.exec(command, timeout_sec=opts.command_timeout_sec)
            obs = observation(result.return_code, result.stdout, result.stderr, opts.max_output_chars)
            call["exit_code"] = result.return_code
        except RuntimeError as e:  # the sandbox raises on a command timeout
            if "timed out" not in str(e):
                raise
            obs = observation(None, None, None, opts.max_output_chars)
            call["exit_code"] = None
        call["observation"] = obs
        return obs

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        import openai

        base_url, api_key = self._endpoint()
        if not self.model_name:
            raise ValueError(f"{self.name()}: no model: set AgentConfig.model_name")
        client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, max_retries=0, timeout=self.options.request_timeout_sec
        )
        messages: list[dict[str, str]] = [
            {"role": "system", "content": SYSTEM},
            *EXAMPLE,
            {"role": "user", "content": f"Task: {instruction.strip()}"},
        ]
        traj = self._trajectory(instruction, base_url)
        context.n_input_tokens = context.n_input_tokens or 0
        context.n_output_tokens = context.n_output_tokens or 0
        try:
            for turn in range(self.options.max_turns):
                text, call = await self._ask(client, messages, turn, traj, context)
                messages.append({"role": "assistant", "content": text})
                self._write(traj)
                command = extract_command(text)
                if command is None:
                    if is_done(text):
                        traj["stop_reason"] = "done"
                        break
                    messages.append({"role": "user", "content": NO_COMMAND})
                    continue
                messages.append({"role": "user", "content": await self._act(environment, command, call)})
                self._write(traj)
                if is_done(text.replace(command, "")):
                    traj["stop_reason"] = "done"
                    break
            else:
                traj["stop_reason"] = "max_turns"
        finally:
            traj["n_calls"] = len(traj["calls"])
            self._write(traj)
            context.metadata = {**(context.metadata or {}), "n_calls": traj["n_calls"], "stop_reason": traj["stop_reason"]}
            await client.close()

    def _write(self, traj: dict) -> None:
        # Atomic: the runner may read it while a timed-out run is being torn down.
        atomic.write_json(Path(self.logs_dir) / "trajectory.json", traj)
