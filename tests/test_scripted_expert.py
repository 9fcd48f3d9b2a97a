"""The scripted expert of the warm-start experiment solves every multi-turn task (training and
held-out split) from the conversation alone: its commands run for real in a copy of the task's
files, the outputs go back in mini-swe-agent's observation format, and the file its second command
writes holds the value the task's checker asks for. Over HTTP it answers as an OpenAI server, in
mini's fenced format, with no token ids."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import openai
import pytest

from testing.scripted_expert import FENCE, SUBMIT, ExpertServer, answer_text, next_command

REPO = Path(__file__).resolve().parents[1]
TASKS = sorted(p for p in (REPO / "datasets/multiturn").glob("**/task.toml"))
CHECK = re.compile(r"read_text\('([^']+)'\)\.strip\(\) == '([^']*)'")


def observation(out: str, rc: int) -> str:
    """mini_textbased.yaml's observation template, as mini renders a command's result."""
    return f"<returncode>{rc}</returncode>\n<output>\n{out}</output>"


@pytest.mark.parametrize("task", TASKS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_the_expert_solves_the_task_from_the_conversation(task, tmp_path):
    d = task.parent
    work = Path(shutil.copytree(d / "environment", tmp_path / "w"))
    messages = [{"role": "system", "content": "You are a helpful assistant that can interact with a computer."},
                {"role": "user", "content": f"Please solve this issue: {(d / 'instruction.md').read_text()}\n\n"
                                            "You can execute bash commands and edit files."}]
    for _ in range(4):
        _, cmd = next_command(messages)
        messages.append({"role": "assistant", "content": answer_text(messages)})
        if cmd == SUBMIT:
            break
        run = subprocess.run(["bash", "-c", cmd], cwd=work, capture_output=True, text=True, timeout=20)
        messages.append({"role": "user", "content": observation(run.stdout + run.stderr, run.returncode)})
    assert cmd == SUBMIT and sum(m["role"] == "assistant" for m in messages) == 3
    name, value = CHECK.search((d / "tests/check.py").read_text()).groups()
    assert (work / name).read_text().strip() == value


def test_over_http_it_answers_in_minis_format(tmp_path):
    server = ExpertServer().start()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "First run this command to see it:\n\ncat note.txt\n\nThen run the command it shows."}]
    out = client.chat.completions.create(model="expert", messages=msgs)
    text = out.choices[0].message.content
    assert re.fullmatch(rf"THOUGHT: .+\n\n```{FENCE}\ncat note.txt\n```", text, re.S)
    assert not hasattr(out.choices[0], "token_ids") or out.choices[0].token_ids is None
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(model="expert", messages=msgs, stream=True) if c.choices)
    assert streamed == text
