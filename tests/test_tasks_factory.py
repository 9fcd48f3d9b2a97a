"""wharf tasks make (wharf/tasks/factory): the mutation operators on real source, bad input in one
line with nothing left behind, and a small task set made end to end from a bundled sdist
(tests/fixtures/factory/tinycalc-0.1, tests/factory_kit.py), each task graded by the real pytest judge: the oracle 1.0,
the untouched workspace 0. Offline: the sdist is put in the cache, and the package's env is a venv
that sees this venv's pytest (what `make` would install from the package index)."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factory_kit import FIXTURE, offline_env, put_sdist, run_cli, tinycalc_cache
from wharf.tasks.factory import cli, mutate
from wharf.tasks.factory.package import FactoryError, parse_spec

CALC = (FIXTURE / "tinycalc" / "calc.py").read_text()


def test_every_candidate_parses_to_a_new_tree_and_changes_only_its_span():
    tree = ast.parse(CALC)
    found = []
    for (q, line) in mutate.functions(tree):
        drawn = mutate.candidates(CALC, "tinycalc/calc.py", q, line)
        found += [m for m in (mutate.finish(CALC, d) for d in drawn) if m is not None]
    ops = {m.operator for m in found}
    assert {"cmp_flip", "negate_if", "drop_stmt", "range_shift", "const_shift", "arith_swap", "swap_args"} <= ops
    for m in found:
        new = mutate.apply(CALC, m)
        assert ast.dump(ast.parse(new)) != ast.dump(tree), m.id
        # Outside the lines of the mutated span, the file is byte for byte the same.
        old_lines, new_lines = CALC.splitlines(), new.splitlines()
        assert old_lines[:m.line - 1] == new_lines[:m.line - 1], m.id
        tail = len(old_lines) - m.end_line
        assert tail == 0 or old_lines[-tail:] == new_lines[-tail:], m.id


def test_flips_and_shifts_read_as_intended():
    src = "def f(xs, n):\n    if n < 2 and xs:\n        return xs[:n]\n    return range(0, n)\n"
    finished = [mutate.finish(src, m) for m in mutate.candidates(src, "m.py", "f", 1)]
    got = {(m.operator, mutate.apply(src, m).splitlines()[m.line - 1].strip()) for m in finished if m is not None}
    # No parentheses beyond what the tree needs (a bug must not read like a machine's edit).
    assert ("cmp_flip", "if n <= 2 and xs:") in got
    assert ("bool_flip", "if n < 2 or xs:") in got
    assert ("negate_if", "if not (n < 2 and xs):") in got
    assert ("slice_shift", "return xs[:n + 1]") in got
    assert ("range_shift", "return range(0, n - 1)") in got
    assert ("drop_stmt", "pass") in got


def test_decorated_functions_are_keyed_by_their_code_objects_first_line():
    src = "import functools\n\n@functools.lru_cache\ndef g(x):\n    return x + 1\n"
    namespace: dict = {}
    exec(compile(src, "m.py", "exec"), namespace)
    assert ("g", namespace["g"].__wrapped__.__code__.co_firstlineno) in mutate.functions(ast.parse(src))


@pytest.mark.parametrize("spec", ["", "==1.0", "a b", "pkg===1"])
def test_a_bad_spec_is_one_line(spec):
    with pytest.raises(FactoryError, match="not a package spec"):
        parse_spec(spec)


def test_bad_input_says_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WHARF_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    code, err = run_cli(["pkg===1", "--out", str(out)], capsys)
    assert (code, len(err)) == (2, 1) and "not a package spec" in err[0]
    (tmp_path / "p.txt").write_text("tinycalc==0.1 colour=red\n")
    code, err = run_cli(["--from", str(tmp_path / "p.txt"), "--out", str(out)], capsys)
    assert (code, len(err)) == (2, 1) and "p.txt:1: 'colour=red'" in err[0]
    code, err = run_cli(["--from", str(tmp_path / "none.txt"), "--out", str(out)], capsys)
    assert (code, len(err)) == (2, 1) and "cannot read it" in err[0]
    assert not out.exists()


def test_shards_split_a_package_list_between_machines_without_overlap(tmp_path, capsys):
    (tmp_path / "p.txt").write_text("".join(f"pkg{i}==1.0\n" for i in range(7)))

    def share(shard: str) -> list[str]:
        args = cli.parser("wharf tasks make").parse_args(["--from", str(tmp_path / "p.txt"), "--out", "o", "--shard", shard])
        return [e.spec for e in cli._entries(args)]

    shares = [share(f"{k}/3") for k in (1, 2, 3)]
    assert shares[1] == ["pkg1==1.0", "pkg4==1.0"]
    assert sorted(s for one in shares for s in one) == [f"pkg{i}==1.0" for i in range(7)]
    assert share("1/1") == [f"pkg{i}==1.0" for i in range(7)]
    for bad in ("0/3", "4/3", "2", "a/b"):
        code, err = run_cli(["--from", str(tmp_path / "p.txt"), "--out", str(tmp_path / "out"), "--shard", bad], capsys)
        assert (code, err) == (2, [f"wharf tasks make: --shard {bad}: expected K/N with 1 <= K <= N, e.g. --shard 2/4"])
    assert not (tmp_path / "out").exists()


def test_an_sdist_without_tests_says_so(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("WHARF_CACHE", str(cache))
    bare = tmp_path / "bare"
    (bare / "bare").mkdir(parents=True)
    (bare / "bare" / "__init__.py").write_text("def one():\n    return 1\n")
    put_sdist(cache, bare, "bare")
    code, err = run_cli(["bare==0.1", "--out", str(tmp_path / "out")], capsys)
    assert (code, err) == (2, ["wharf tasks make: bare==0.1: the sdist ships no tests (no tests/ or test_*.py)"])
    assert not (tmp_path / "out").exists()
    assert cli.main(["bare==0.1", "bare==0.1", "--out", str(tmp_path / "out")]) == 2  # many: a total at the end
    got = capsys.readouterr()
    assert got.err.splitlines() == ["[1/2] bare==0.1", err[0], "[2/2] bare==0.1", err[0]]
    assert got.out.splitlines()[-1].startswith("0 package versions: 0 tasks in ")
    assert got.out.splitlines()[-1].endswith(" min; 2 could not give tasks (said above)")


def test_a_suite_that_never_passes_says_so(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("WHARF_CACHE", str(cache))
    src = tmp_path / "src"
    (src / "tests").mkdir(parents=True)
    (src / "netpkg.py").write_text("import urllib.request\n\ndef get():\n"
                                   "    return urllib.request.urlopen('http://192.0.2.1/', timeout=2).read()\n")
    (src / "tests" / "test_net.py").write_text("from netpkg import get\n\ndef test_get():\n    assert get()\n")
    put_sdist(cache, src, "netpkg")
    offline_env(cache, "netpkg-0.1")
    code, err = run_cli(["netpkg==0.1", "--out", str(tmp_path / "out")], capsys)
    assert (code, err) == (2, ["wharf tasks make: netpkg==0.1: the test suite needs the network (no test passes offline)"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("conftest, why", [
    # boltons 25.0.0: a hook argument today's pytest no longer has; pytest stops before collecting
    ("def pytest_ignore_collect(path, config):\n    return False\n",
     "0 collected; pytest stopped: Argument(s) {'path'} are declared in the hookimpl but can not be found in the "
     "hookspec"),
    # wcwidth 0.9.4: an autouse fixture wants the C extension, so every test errors the same way
    ("import pytest\n\n@pytest.fixture(autouse=True)\ndef _c():\n    assert False, 'C extension not loaded'\n",
     "2 collected; 2 failed, 2 of them with: AssertionError: C extension not loaded"),
], ids=["a-hook-pytest-refuses", "a-fixture-that-always-fails"])
def test_a_suite_that_cannot_pass_says_the_cause(tmp_path, capsys, monkeypatch, conftest, why):
    cache = tmp_path / "cache"
    monkeypatch.setenv("WHARF_CACHE", str(cache))
    src = tmp_path / "src"
    (src / "tests").mkdir(parents=True)
    (src / "oldpkg.py").write_text("def one():\n    return 1\n")
    (src / "tests" / "conftest.py").write_text(conftest)
    (src / "tests" / "test_one.py").write_text("from oldpkg import one\n\ndef test_one():\n    assert one() == 1\n\n"
                                               "def test_two():\n    assert one() + one() == 2\n")
    put_sdist(cache, src, "oldpkg")
    offline_env(cache, "oldpkg-0.1")
    code, err = run_cli(["oldpkg==0.1", "--out", str(tmp_path / "out")], capsys)
    assert (code, err) == (2, [f"wharf tasks make: oldpkg==0.1: no test passes on the pristine source ({why})"])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_make_a_small_set_end_to_end_each_task_checked_by_the_judge(tmp_path, capsys, monkeypatch):
    out = tinycalc_cache(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)  # a relative --out, as a user types it
    code, err = run_cli(["tinycalc==0.1", "--out", "out", "--max", "3", "--seed", "1", "--jobs", "2"], capsys)
    assert code == 0, err
    tasks = sorted(p for p in out.iterdir() if p.name.startswith("tinycalc-0.1__"))
    assert 1 <= len(tasks) <= 3  # each one passed the check: oracle 1.0, untouched workspace 0
    manifest = json.loads((out / "manifests" / "tinycalc-0.1.seed1.json").read_text())
    assert len(manifest["bugs"]) == len(tasks) and manifest["stats"]["kept"] >= len(tasks)
    assert f"pytest=={pytest.__version__}" in manifest["env"]  # the env's lock, as the hunt and checks ran in it
    for task, bug in zip(tasks, sorted(manifest["bugs"], key=lambda b: cli.make.taskdir.task_id(
            cli.make.package.Package("tinycalc", "0.1", FIXTURE, ".", []), b))):
        spec = json.loads((task / "tests" / "spec.json").read_text())
        assert spec["FAIL_TO_PASS"] == bug["FAIL_TO_PASS"] and spec["FAIL_TO_PASS"]
        assert (task / "tests" / "tests" / "test_calc.py").read_text() == (FIXTURE / "tests" / "test_calc.py").read_text()
        instruction = (task / "instruction.md").read_text()
        assert spec["FAIL_TO_PASS"][0] in instruction and bug["replacement"] not in instruction
        buggy = (task / "environment" / "tinycalc" / "calc.py").read_text()
        assert buggy != CALC and buggy == mutate.apply(CALC, cli.make.taskdir.mutation_of(bug))
        assert "--- a/tinycalc/calc.py" in (task / "solution" / "fix.patch").read_text()
    # The manifest alone makes the same task dirs again (and the hunt is not rerun).
    again = tmp_path / "again"
    code, _ = run_cli(["tinycalc==0.1", "--out", str(again), "--manifests", str(out / "manifests"), "--seed", "1",
                    "--no-check"], capsys)
    assert code == 0
    for task in tasks:
        for f in ("tests/spec.json", "instruction.md", "solution/fix.patch", "environment/tinycalc/calc.py"):
            assert (again / task.name / f).read_text() == (task / f).read_text()
    # --max samples a manifest: its first bugs, the same dirs.
    one = tmp_path / "one"
    code, _ = run_cli(["tinycalc==0.1", "--out", str(one), "--manifests", str(out / "manifests"), "--seed", "1",
                    "--no-check", "--max", "1"], capsys)
    made = [p.name for p in one.iterdir() if p.name.startswith("tinycalc-0.1__")]
    assert code == 0 and len(made) == 1 and made[0] in {t.name for t in tasks}


def test_unittest_cases_are_kept_and_tests_defined_in_another_file_are_marked(tmp_path):
    """suite_run marks a test whose function another file defines (a mixin from tests/__init__.py):
    the judge runs whole files and grades only what they define, so suite.baseline leaves such a
    file out. A unittest.TestCase test of the file's own passes and is not marked."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tinyu.py").write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "tests" / "__init__.py").write_text(
        "from tinyu import add\n\nclass Mixin:\n    def test_from_mixin(self):\n        assert add(1, 2) == 3\n")
    (tmp_path / "tests" / "test_own.py").write_text(
        "import unittest\nfrom tinyu import add\n\nclass Own(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 2), 4)\n")
    (tmp_path / "tests" / "test_mixed.py").write_text(
        "import unittest\nfrom . import Mixin\n\nclass Mixed(unittest.TestCase, Mixin):\n"
        "    def test_here(self):\n        self.assertTrue(True)\n")
    out = tmp_path / "out.json"
    runner = Path(cli.make.suite.RUNNER)
    subprocess.run([sys.executable, "-I", str(runner), str(out), str(tmp_path), "1", "--", "-p", "no:cacheprovider",
                    "-o", f"pythonpath={tmp_path}", "--rootdir", str(tmp_path), "-q", "tests"],
                   cwd=tmp_path, check=True, capture_output=True)
    tests = json.loads(out.read_text())["tests"]
    seen = {t: (r["outcome"], r["foreign"]) for t, r in tests.items()}
    assert seen == {"tests/test_own.py::Own::test_add": ("passed", False),
                    "tests/test_mixed.py::Mixed::test_here": ("passed", False),
                    "tests/test_mixed.py::Mixed::test_from_mixin": ("passed", True)}
    assert ["tinyu.py", "add", 1] in tests["tests/test_own.py::Own::test_add"]["funcs"]


def test_tests_beside_the_package_in_src_are_found(tmp_path):
    """configobj ships src/configobj/ and src/tests/: the tests are found there when there are none at the top."""
    from wharf.tasks.factory.package import find_layout
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "__init__.py").write_text("")
    (tmp_path / "src" / "tests").mkdir()
    (tmp_path / "src" / "tests" / "test_pkg.py").write_text("def test_x():\n    pass\n")
    assert find_layout(tmp_path) == ("src", ["src/tests"])
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_top.py").write_text("def test_y():\n    pass\n")
    assert find_layout(tmp_path) == ("src", ["tests"])
