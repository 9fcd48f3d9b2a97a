"""changes.merge: what of the agent's workdir reaches the verifier (pure, no sandbox needed)."""
from __future__ import annotations

from collect.sandbox import changes


def f(text: str, x: bool = False):
    return (text.encode(), x)


def test_source_edits_new_files_dirs_and_deletions_pass():
    pristine = {"calc.py": f("a - b"), "old.py": f("x"), "pkg": None, "pkg/m.py": f("m")}
    agent = {"calc.py": f("a + b"), "new.py": f("n"), "out": None, "pkg": None, "pkg/m.py": f("m"), "run.sh": f("s", True)}
    m = changes.merge(pristine, agent, [], set())
    assert m.tree["calc.py"] == f("a + b") and m.tree["new.py"] == f("n") and m.tree["run.sh"] == f("s", True)
    assert "out" in m.tree and m.tree["out"] is None
    assert "old.py" not in m.tree and m.deleted == ["old.py"]
    assert sorted(m.changed) == ["calc.py", "new.py", "run.sh"] and not m.set_aside


def test_tests_and_test_config_are_set_aside_or_restored():
    pristine = {"test_task.py": f("real"), "setup.cfg": f("cfg"), "m.py": f("m")}
    agent = {"test_task.py": f("fake"), "m.py": f("m"), "conftest.py": f("c"), "sub/conftest.py": f("c"),
             "pytest.ini": f("i"), "tox.ini": f("t"), "pyproject.toml": f("p"), "x.pth": f("p"),
             "sitecustomize.py": f("s"), "usercustomize.py": f("u"), "__pycache__/m.cpython-312.pyc": f("b"),
             "tests/test_new.py": f("t"), "helper_test.py": f("h"), "spec.json": f("j"),
             "pytest.py": f("p"), "json/__init__.py": f("j"), ".git/config": f("g")}
    m = changes.merge(pristine, agent, ["link"], {"spec.json", "test_task.py"})
    assert m.tree == {"test_task.py": f("real"), "setup.cfg": f("cfg"), "m.py": f("m")}
    assert m.set_aside["setup.cfg"].startswith("deleted, restored")
    assert m.set_aside["link"] == "not a regular file" and m.set_aside[".git"] == "git metadata"
    assert "shadows the grader's module 'pytest'" == m.set_aside["pytest.py"]
    assert not m.changed


def test_tar_round_trip():
    tree = {"a.py": f("x"), "d": None, "d/b.sh": f("y", True)}
    back, others = changes.read_tar(changes.write_tar(tree))
    assert back == tree and others == []
