"""`wharf agents-check` from the installed command: its scripted upstream (testing/vllm_stub.py)
is left out of the wheel, so the command finds it in the checkout beside its own sources, and
says in one line how to get a checkout when there is none."""
from __future__ import annotations

import subprocess
import sys

import pytest

from wharf.pipeline import agents_check
from wharf.pipeline.agents_check import CheckoutMissing, stub_server
from tests.conftest import REPO

# Our packages but not testing/ on the path, as the console script of an editable install sees them.
PROBE = """
import importlib.util, sys
sys.path.insert(0, {root!r})
assert importlib.util.find_spec("testing") is None, "testing/ is importable before the command looks for it"
from wharf.pipeline.agents_check import stub_server
print(stub_server().__module__)
"""


def test_the_installed_command_finds_its_stub_in_the_checkout(tmp_path):
    for pkg in ("wharf", "engine", "collect", "convert", "train", "pipeline"):
        (tmp_path / pkg).symlink_to(REPO / pkg)
    # -I: no PYTHONPATH, no script dir or cwd on sys.path (what a console script gets)
    p = subprocess.run([sys.executable, "-I", "-c", PROBE.format(root=str(tmp_path))], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "testing.vllm_stub"


def test_without_a_checkout_it_says_how_to_get_one(tmp_path, capsys, monkeypatch):
    with pytest.raises(CheckoutMissing, match="run it from a clone"):
        stub_server(tmp_path)
    monkeypatch.setattr(agents_check, "REPO", tmp_path)  # where an installed wheel's sources sit
    assert agents_check.main(["--only", "minimal"], "wharf agents-check") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("wharf agents-check: needs a wharf checkout"), err
