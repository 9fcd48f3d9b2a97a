"""The one command line: `wharf <command>` (wharf/pipeline/cli.py) and its shared idiom (wharf/core/entry.py)."""
from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from wharf.pipeline.cli import COMMANDS

REPO = Path(__file__).resolve().parents[1]


def wharf(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wharf.pipeline.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_every_command_names_a_module_with_main_argv_prog():
    for name, (module, _) in COMMANDS.items():
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin, f"wharf {name}: no module {module}"
        tree = ast.parse(Path(spec.origin).read_text())
        mains = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "main"]
        assert mains and [a.arg for a in mains[0].args.args] == ["argv", "prog"], f"wharf {name}: {module}.main(argv, prog)"


def test_help_lists_the_commands_and_an_unknown_one_is_refused():
    out = wharf("--help")
    assert out.returncode == 0 and all(f"  {name} " in out.stdout for name in COMMANDS)
    out = wharf("trian")
    assert out.returncode == 2 and "unknown command 'trian'" in out.stderr


def test_a_refusal_is_one_line_and_exit_1(tmp_path):
    out = wharf("replay", "--job", str(tmp_path / "nowhere"), f"runs_dir={tmp_path}")
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"wharf replay: {tmp_path / 'nowhere'} is not a collect dir (no rollouts.parquet): "
        "name runs/<run>/rounds/<k>/collect dirs"]
    assert not any(tmp_path.iterdir())  # nothing written


def test_a_bad_config_is_one_line_and_exit_2():
    out = wharf("report", "--help")
    assert out.returncode == 0 and "--compare" in out.stdout
    out = wharf("publish", "train.lora_rank=128")
    assert out.returncode == 2
    assert out.stderr.strip() == ("wharf publish: bad config: defaults: train.lora_rank=128 is above "
                                  "train.max_lora_rank=64 (the endpoint's --max-lora-rank): lower the rank or raise the limit")


def test_version_is_the_installed_distributions():
    import tomllib

    want = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    out = wharf("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"wharf {want}", out
