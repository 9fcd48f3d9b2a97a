"""Every refusal of the `wharf` command line is one line naming the file, key or argument and what
to do, exit 2 (the command line is wrong) or 1 (the command could not do it), and nothing written:
each case of issue 56, run as a user runs it, in a fresh working directory (where a run's default
`runs/` would go). Most run in this process (`main(argv)`, imports paid once); the ones about the
process itself (a closed pipe, the port checked before the engine loads) as `python -m wharf.pipeline.cli`."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from wharf.core.entry import launch

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "datasets" / "toy"
MINI = {"trajectory_format": "mini-swe-agent-1.1",
        "messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "echo hi"}]}


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def wharf(command: str, *argv: str) -> int:
    """`wharf <command> argv...` in this process; argparse's exit is its status."""
    from wharf.pipeline.cli import COMMANDS

    try:
        return launch(COMMANDS[command][0], f"wharf {command}", list(argv))
    except SystemExit as e:
        return e.code


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refused(cwd: Path, capsys, code: int, message: str, command: str, *argv: str) -> None:
    """`wharf command argv` exits `code` with the one line `wharf <command>: <message...>` on stderr
    and leaves the working directory as it was."""
    before = files(cwd)
    rc = wharf(command, *argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == code, err
    assert len(lines) == 1 and lines[0].startswith(f"wharf {command}: {message}"), err
    assert files(cwd) == before, files(cwd) - before


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


# -- wharf import ---------------------------------------------------------------------------------

def test_import_with_its_arguments_swapped(cwd, capsys):
    write(cwd / "a.traj.json", MINI)
    refused(cwd, capsys, 2, "a.traj.json: is a file, not a collect dir: the dir to write comes first", "import",
            "a.traj.json", "out")


def test_import_of_a_mini_trajectory_whose_info_config_is_not_a_mapping(cwd, capsys):
    write(cwd / "a.traj.json", {**MINI, "info": {"config": "oops"}})
    refused(cwd, capsys, 1, "a.traj.json: info.config: expected a mapping", "import", "out", "a.traj.json",
            "--reward", "1")


def test_import_beside_a_result_json_whose_verifier_result_is_not_a_mapping(cwd, capsys):
    traj = write(cwd / "job" / "say-hi__x1" / "agent" / "mini-swe-agent.trajectory.json", MINI)
    write(cwd / "job" / "say-hi__x1" / "result.json", {"verifier_result": "oops"})
    refused(cwd, capsys, 1, "job/say-hi__x1/result.json: verifier_result: expected a mapping", "import", "out",
            str(traj.relative_to(cwd)))


def test_import_with_a_reward_that_is_not_a_number(cwd, capsys):
    write(cwd / "a.traj.json", MINI)
    for bad in ("nan", "inf", "one"):
        refused(cwd, capsys, 2, f"argument --reward: invalid finite value: '{bad}'", "import", "out", "a.traj.json",
                "--reward", bad)


def test_import_of_the_same_file_twice(cwd, capsys):
    write(cwd / "job" / "t__1" / "agent" / "mini-swe-agent.trajectory.json", MINI)
    refused(cwd, capsys, 2, "job/t__1/agent/mini-swe-agent.trajectory.json: named twice", "import", "out", "job",
            "job/t__1/agent/mini-swe-agent.trajectory.json", "--reward", "1")


def test_import_of_tool_calls_given_as_text(cwd, capsys):
    bad = {**MINI, "messages": [MINI["messages"][0], {"role": "assistant", "content": "x", "tool_calls": "oops"}]}
    write(cwd / "a.traj.json", bad)
    refused(cwd, capsys, 1, "a.traj.json: messages[1].tool_calls: expected a list of tool calls", "import", "out",
            "a.traj.json", "--reward", "1")


def test_import_of_a_path_that_is_not_there(cwd, capsys):
    refused(cwd, capsys, 2, "nowhere.json: no such file or directory", "import", "out", "nowhere.json")


# -- audit, agents-check, report ------------------------------------------------------------------

def test_audit_with_a_tokenizer_dir_that_is_not_there(cwd, capsys):
    write(cwd / "c" / "rollouts.parquet", "")  # only its presence is checked before the tokenizer
    refused(cwd, capsys, 2, "--tokenizer MISSING: not a Hugging Face tokenizer dir", "audit", "c", "--tokenizer",
            "MISSING")
    refused(cwd, capsys, 2, "nowhere: not a collect dir (no rollouts.parquet)", "audit", "nowhere")


def test_agents_check_with_an_agent_it_does_not_know_a_file_for_out_or_a_taken_port(cwd, capsys, taken_port):
    refused(cwd, capsys, 2, "--only: no agent named nope; known: minimal, mini-swe-agent", "agents-check", "--only",
            "minimal,nope")
    write(cwd / "afile", "x")
    refused(cwd, capsys, 2, "--out afile: is a file, not a directory", "agents-check", "--out", "afile")
    refused(cwd, capsys, 1, f"--proxy-port={taken_port}: cannot listen", "agents-check", "--proxy-port",
            str(taken_port))


def test_report_compare_writes_only_where_told(cwd, capsys):
    (cwd / "docs").mkdir()
    refused(cwd, capsys, 2, "--compare: name the figure to write with --out FILE.png", "report", "--compare",
            "a=runs/a")
    refused(cwd, capsys, 1, "--compare a=runs/a: runs/a is not a run dir with rounds", "report", "--compare",
            "a=runs/a", "--out", "a.png")
    refused(cwd, capsys, 2, "--out a.txt: name a .png, .svg or .pdf file", "report", "--compare", "a=runs/a",
            "--out", "a.txt")


# -- config-taking commands -----------------------------------------------------------------------

def test_eval_with_no_policy_or_no_dataset(cwd, capsys):
    refused(cwd, capsys, 2, "bad config: defaults: eval.policies is empty", "eval", "eval.policies=[]")
    refused(cwd, capsys, 2, "eval.dataset (collect.dataset when unset): nope is not a directory", "eval",
            "eval.dataset=nope")


@pytest.mark.parametrize("command", ["collect", "loop"])
def test_collect_and_loop_check_dataset_and_agent_before_writing_or_starting_anything(cwd, capsys, command):
    # endpoint.kind=vllm with nothing answering and no vllm here: an endpoint check first would say so
    dead = ["endpoint.kind=vllm", "endpoint.launch=true", "endpoint.url=http://127.0.0.1:9"]
    refused(cwd, capsys, 2, "collect.dataset: nope is not a directory of harbor tasks", command,
            "collect.dataset=nope", *dead)
    refused(cwd, capsys, 2, "collect.tasks: ['nope'] not found", command, f"collect.dataset={TOY}",
            "collect.tasks=[nope]", *dead)
    refused(cwd, capsys, 2, "collect.agent='wharf.collect.agents.minimal:Nope'", command, f"collect.dataset={TOY}",
            "collect.agent=wharf.collect.agents.minimal:Nope", *dead)
    refused(cwd, capsys, 1, "nothing answers at http://127.0.0.1:9/health and endpoint.launch is false", command,
            f"collect.dataset={TOY}", "endpoint.launch=false", "endpoint.url=http://127.0.0.1:9")
    refused(cwd, capsys, 1, f"engine.model='{cwd / 'no-model'}': not a local Hugging Face model dir", command,
            f"collect.dataset={TOY}", f"engine.model={cwd / 'no-model'}", "endpoint.url=http://127.0.0.1:9")


def test_loop_checks_its_eval_dataset_before_the_endpoint(cwd, capsys):
    refused(cwd, capsys, 2, "loop.eval_dataset: nope is not a directory of harbor tasks", "loop",
            f"collect.dataset={TOY}", "loop.eval_every=1", "loop.eval_dataset=nope", "endpoint.launch=false",
            "endpoint.url=http://127.0.0.1:9")


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_standalone_proxy_on_a_taken_port_writes_nothing(cwd, capsys, taken_port):
    refused(cwd, capsys, 1, f"proxy.port={taken_port}: cannot listen on 127.0.0.1:{taken_port}", "proxy",
            f"proxy.port={taken_port}")
    refused(cwd, capsys, 1, f"proxy.admin_port={taken_port}: cannot listen", "proxy", "proxy.port=0",
            f"proxy.admin_port={taken_port}")
    refused(cwd, capsys, 1, "proxy.port and proxy.admin_port are both 8201: give each its own", "proxy",
            "proxy.port=8201", "proxy.admin_port=8201")
    refused(cwd, capsys, 1, "engine.host=no-such-host.invalid: cannot resolve it", "serve",
            "engine.host=no-such-host.invalid")


def test_standalone_proxy_leaves_a_finished_round_alone(cwd, capsys):
    write(cwd / "runs" / "default" / "rounds" / "0" / "collect" / "manifest.json", {"state": "done"})
    refused(cwd, capsys, 1, "runs/default/rounds/0/collect is a finished collect round: set proxy.out_dir=DIR",
            "proxy", "proxy.port=0")


def test_serve_checks_its_port_before_it_loads_anything(tmp_path, taken_port):
    # The model named does not exist: loading it first would be the error; the port comes first.
    out = subprocess.run([sys.executable, "-m", "wharf.pipeline.cli", "serve", f"engine.port={taken_port}",
                          f"engine.model={tmp_path / 'no-model'}"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 1 and out.stderr.splitlines() == [
        f"wharf serve: engine.port={taken_port}: cannot listen on 127.0.0.1:{taken_port} (Address already in use): "
        f"stop what listens there, or pick another port with engine.port=PORT"]
    assert not any(tmp_path.iterdir())


# -- help ------------------------------------------------------------------------------------------

def help_of(command: str, capsys) -> str:
    assert wharf(command, "--help") == 0
    return capsys.readouterr().out


def test_help_lists_the_keys_the_command_reads(capsys):
    serve = help_of("serve", capsys)
    assert "  engine.port = 8100" in serve and "  train." not in serve and "  collect." not in serve
    loop = help_of("loop", capsys)
    assert all(f"  {k}." in loop for k in ("engine", "collect", "convert", "train", "loop", "eval"))
    assert "  train.lr" in help_of("train", capsys) and "  collect.attempts" not in help_of("convert", capsys)


@pytest.mark.parametrize("command", ["audit", "agents-check", "import", "report"])
def test_help_descriptions_are_whole_sentences(command, capsys):
    text = help_of(command, capsys)
    description = " ".join(text.split("\n\n")[1].split())
    assert description.endswith("."), description


def test_help_into_a_pipe_closed_early_is_not_an_error(tmp_path):
    """`wharf --help | head`: the reader gone before wharf writes."""
    for argv in (["--help"], ["serve", "--help"]):
        proc = subprocess.Popen([sys.executable, "-m", "wharf.pipeline.cli", *argv], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) in (0, 141) and err == "", err


# -- the sweep -----------------------------------------------------------------------------------

CONFIG_MISTAKES = (["collect.atempts=3"], ["--config", "missing.yaml"], ["collect.attempts=three"], ["--nope"])
OWN_MISTAKES = {
    "import": (["out", "missing.json"], ["out", "a.traj.json", "--reward", "x"], ["--nope"], ["a.traj.json", "out"]),
    "audit": (["missing"], ["--nope"], ["missing", "--tokenizer", "missing"]),
    "report": (["missing"], ["--compare", "a=missing"], ["--table", "missing"], ["--nope"]),
    "agents-check": (["--only", "x"], ["--engine-port", "x"], ["--nope"]),
}


def test_sweep_every_command_refuses_a_bad_key_a_missing_file_and_a_wrong_type_in_one_line(cwd, capsys):
    """Each command with an unknown key or option, a file that is not there and a value of the
    wrong type: a one-line refusal, no traceback (here: no exception out of main), nothing written."""
    from wharf.pipeline.cli import COMMANDS

    write(cwd / "a.traj.json", MINI)
    for command in COMMANDS:
        for argv in OWN_MISTAKES.get(command, CONFIG_MISTAKES):
            before = files(cwd)
            rc = wharf(command, *argv)
            err = capsys.readouterr().err.strip().splitlines()
            assert rc in (1, 2) and len(err) == 1 and err[0].startswith(f"wharf {command}: "), (command, argv, err)
            assert files(cwd) == before, (command, argv, files(cwd) - before)


@pytest.mark.parametrize("command", ["collect", "loop", "eval", "proxy", "convert"])
def test_a_runs_dir_that_is_a_file_is_refused_before_anything_is_written(cwd, capsys, command):
    write(cwd / "runs", "not a directory")
    refused(cwd, capsys, 2, "bad config: runs_dir=runs, name=default: runs is a file, not a directory", command)
