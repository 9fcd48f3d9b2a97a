"""changes.merge: what of the agent's workdir reaches the verifier (pure, no sandbox needed)."""
from __future__ import annotations

from wharf.collect.sandbox import changes


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


def test_links_in_a_real_workdir_arrive_as_the_files_they_are_and_nothing_is_deleted(tmp_path):
    import os
    import subprocess

    work = tmp_path / "app"
    (work / "pkg").mkdir(parents=True)
    (work / "mathutil.py").write_text("def f():\n    return 1\n")
    (work / "run.sh").write_text("echo hi\n")
    (work / "run.sh").chmod(0o755)
    for name in ("twin.py", "pkg/again.py", "zz.py", "aa.py"):  # whichever name tar stores second is a link
        os.link(work / "mathutil.py", work / name)
    os.link(work / "run.sh", work / "run2.sh")
    (work / "alias.py").symlink_to("mathutil.py")
    (work / "pkg" / "up.py").symlink_to("../alias.py")  # a chain, through a parent
    (work / "out.txt").symlink_to("/etc/hostname")  # leaves the workdir: not carried
    (work / "loop.py").symlink_to("loop.py")
    (work / "escape.py").symlink_to("../../etc/hostname")
    (work / "pkg_link").symlink_to("pkg")  # a dir: not carried
    data = subprocess.run(["tar", "-cf", "-", "-C", str(work), "."], capture_output=True, check=True).stdout
    agent, others = changes.read_tar(data)
    body = f("def f():\n    return 1\n")
    for name in ("mathutil.py", "twin.py", "pkg/again.py", "zz.py", "aa.py", "alias.py", "pkg/up.py"):
        assert agent[name] == body, name
    assert agent["run2.sh"] == agent["run.sh"] == f("echo hi\n", True)
    assert others == ["escape.py", "loop.py", "out.txt", "pkg_link"]
    pristine = {"mathutil.py": f("def f():\n    return 0\n"), "run.sh": f("echo hi\n", True)}
    m = changes.merge(pristine, agent, others, set())
    assert m.tree["mathutil.py"] == body and m.tree["run.sh"] == f("echo hi\n", True) and m.deleted == []
    assert {k: v for k, v in m.set_aside.items()} == {n: "not a regular file" for n in others}


def test_a_shipped_environment_is_read_without_its_bytecode(tmp_path):
    (tmp_path / "app" / "__pycache__").mkdir(parents=True)
    (tmp_path / "app" / "m.py").write_text("x = 1\n")
    (tmp_path / "app" / "__pycache__" / "m.cpython-312.pyc").write_bytes(b"\x00")
    (tmp_path / "stray.pyc").write_bytes(b"\x00")
    assert changes.read_dir(tmp_path) == {"app": None, "app/m.py": (b"x = 1\n", False)}
