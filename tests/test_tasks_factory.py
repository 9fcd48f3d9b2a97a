"""wharf tasks make (wharf/tasks/factory): the mutation operators on real source, bad input in one
line with nothing left behind, and a small task set made end to end from a bundled sdist
(tests/fixtures/factory/tinycalc-0.1), each task graded by the real pytest judge: the oracle 1.0,
the untouched workspace 0. Offline: the sdist is put in the cache, and the package's env is a venv
that sees this venv's pytest (what `make` would install from the package index)."""
from __future__ import annotations

import ast
import json
import time
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest

from wharf.tasks.factory import cli, mutate
from wharf.tasks.factory.package import FactoryError, parse_spec

FIXTURE = Path(__file__).parent / "fixtures" / "factory" / "tinycalc-0.1"
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


def _cli(args: list[str], capsys) -> tuple[int, list[str]]:
    code = cli.main(args)
    return code, capsys.readouterr().err.strip().splitlines()


def test_bad_input_says_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WHARF_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    code, err = _cli(["pkg===1", "--out", str(out)], capsys)
    assert (code, len(err)) == (2, 1) and "not a package spec" in err[0]
    (tmp_path / "p.txt").write_text("tinycalc==0.1 colour=red\n")
    code, err = _cli(["--from", str(tmp_path / "p.txt"), "--out", str(out)], capsys)
    assert (code, len(err)) == (2, 1) and "p.txt:1: 'colour=red'" in err[0]
    code, err = _cli(["--from", str(tmp_path / "none.txt"), "--out", str(out)], capsys)
    assert (code, len(err)) == (2, 1) and "cannot read it" in err[0]
    assert not out.exists()


def _sdist(cache: Path, src: Path, name: str) -> None:
    """src packed as the cache's sdist `name`-0.1.tar.gz (what `pip download` would have put there)."""
    sdists = cache / "tasks" / "sdists"
    sdists.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdists / f"{name}-0.1.tar.gz", "w:gz") as t:
        t.add(src, arcname=f"{name}-0.1")


def _offline_env(cache: Path, key: str) -> None:
    """The package's env as `make` builds it, but offline: a venv that sees this venv's pytest."""
    env = cache / "tasks" / "envs" / key
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = next((env / "lib").glob("python3*/site-packages"))
    # its real path: a sandbox shows the venv at its real path only (.venv may be a link)
    (site / "wharf_host.pth").write_text(os.path.realpath(sysconfig.get_paths()["purelib"]) + "\n")
    env.chmod(0o755)


def test_an_sdist_without_tests_says_so(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("WHARF_CACHE", str(cache))
    bare = tmp_path / "bare"
    (bare / "bare").mkdir(parents=True)
    (bare / "bare" / "__init__.py").write_text("def one():\n    return 1\n")
    _sdist(cache, bare, "bare")
    code, err = _cli(["bare==0.1", "--out", str(tmp_path / "out")], capsys)
    assert (code, err) == (2, ["wharf tasks make: bare==0.1: the sdist ships no tests (no tests/ or test_*.py)"])
    assert not (tmp_path / "out").exists()


def test_a_suite_that_never_passes_says_so(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("WHARF_CACHE", str(cache))
    src = tmp_path / "src"
    (src / "tests").mkdir(parents=True)
    (src / "netpkg.py").write_text("import urllib.request\n\ndef get():\n"
                                   "    return urllib.request.urlopen('http://192.0.2.1/', timeout=2).read()\n")
    (src / "tests" / "test_net.py").write_text("from netpkg import get\n\ndef test_get():\n    assert get()\n")
    _sdist(cache, src, "netpkg")
    _offline_env(cache, "netpkg-0.1")
    code, err = _cli(["netpkg==0.1", "--out", str(tmp_path / "out")], capsys)
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
    _sdist(cache, src, "oldpkg")
    _offline_env(cache, "oldpkg-0.1")
    code, err = _cli(["oldpkg==0.1", "--out", str(tmp_path / "out")], capsys)
    assert (code, err) == (2, [f"wharf tasks make: oldpkg==0.1: no test passes on the pristine source ({why})"])
    assert not (tmp_path / "out").exists()


def _tinycalc(tmp_path: Path, monkeypatch, src: Path = FIXTURE) -> Path:
    """A cache of its own holding tinycalc's sdist (packed from `src`) and its offline env; the out dir."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("WHARF_CACHE", str(cache))
    _sdist(cache, src, "tinycalc")
    _offline_env(cache, "tinycalc-0.1")
    return tmp_path / "out"


@pytest.mark.slow
def test_make_a_small_set_end_to_end_each_task_checked_by_the_judge(tmp_path, capsys, monkeypatch):
    out = _tinycalc(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)  # a relative --out, as a user types it
    code, err = _cli(["tinycalc==0.1", "--out", "out", "--max", "3", "--seed", "1", "--jobs", "2"], capsys)
    assert code == 0, err
    tasks = sorted(p for p in out.iterdir() if p.name.startswith("tinycalc-0.1__"))
    assert 1 <= len(tasks) <= 3  # each one passed the check: oracle 1.0, untouched workspace 0
    manifest = json.loads((out / "manifests" / "tinycalc-0.1.seed1.json").read_text())
    assert len(manifest["bugs"]) == len(tasks) and manifest["stats"]["kept"] >= len(tasks)
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
    code, _ = _cli(["tinycalc==0.1", "--out", str(again), "--manifests", str(out / "manifests"), "--seed", "1",
                    "--no-check"], capsys)
    assert code == 0
    for task in tasks:
        for f in ("tests/spec.json", "instruction.md", "solution/fix.patch", "environment/tinycalc/calc.py"):
            assert (again / task.name / f).read_text() == (task / f).read_text()
    # --max samples a manifest: its first bugs, the same dirs.
    one = tmp_path / "one"
    code, _ = _cli(["tinycalc==0.1", "--out", str(one), "--manifests", str(out / "manifests"), "--seed", "1",
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


@pytest.mark.slow
def test_wharf_tasks_make_checks_each_task_with_tasks_check_and_the_manifest_says_so(tmp_path, capsys, monkeypatch):
    """Through `wharf tasks` (the dispatcher hands the factory wharf tasks check's check_task): the
    kept task passed the whole check (oracle 1.0 and untouched 0 over 3 bwrap trials each, the
    tier-1 exploits 0, and, being the package's sample, the red team's attackers 0), and its bug in
    the manifest records it under the judges' code as it is."""
    from wharf.pipeline.tasks import main as tasks_main
    from wharf.tasks.factory.verify import judge_digest

    src = tmp_path / "src"
    shutil.copytree(FIXTURE, src)
    (src / "Dockerfile").write_text("FROM python:3.12\n")  # the sdist's own, as croniter's: not the task's image
    out = _tinycalc(tmp_path, monkeypatch, src)
    assert tasks_main(["make", "tinycalc==0.1", "--out", str(out), "--max", "1", "--seed", "1"]) == 0, capsys.readouterr()
    [task] = [p for p in out.iterdir() if p.name.startswith("tinycalc-0.1__")]
    assert "--only-spec" in (task / "tests" / "test.sh").read_text()
    assert not (task / "environment" / "Dockerfile").exists()
    [bug] = json.loads((out / "manifests" / "tinycalc-0.1.seed1.json").read_text())["bugs"]
    assert {k: bug["checked"][k] for k in ("judge", "runs", "tier1", "tier2")} == {
        "judge": judge_digest(), "runs": 3, "tier1": True, "tier2": True}
    assert 0 < bug["checked"]["seconds"] < 600


def test_the_factorys_own_check_names_the_judges_reason_when_it_could_not_judge(tmp_path):
    from wharf.tasks.factory.verify import _reward

    (tmp_path / "verifier_error.txt").write_text("pytest did not start: /x/bin/python: not found\n")
    assert _reward(tmp_path) == "a verifier error: pytest did not start: /x/bin/python: not found"
    (tmp_path / "reward.json").write_text('{"reward": 0.0}')
    assert _reward(tmp_path) == 0.0
    (tmp_path / "reward.json").unlink()
    (tmp_path / "verifier_error.txt").unlink()
    assert "no reward" in _reward(tmp_path)


def test_rejudge_prunes_the_tests_the_judge_no_longer_passes_and_drops_bugs_left_with_none():
    from wharf.tasks.factory.rejudge import prune

    bugs = [{"FAIL_TO_PASS": ["t.py::a", "t.py::gc"], "PASS_TO_PASS": ["t.py::b"], "checked": {"judge": "x"},
             "messages": {"t.py::a": "m", "t.py::gc": "n"}},
            {"FAIL_TO_PASS": ["t.py::gc"], "PASS_TO_PASS": ["t.py::a"]},
            {"FAIL_TO_PASS": ["t.py::a"], "PASS_TO_PASS": ["t.py::b"], "checked": {"judge": "x"}}]
    manifest = {"bugs": bugs}
    assert prune(manifest, {"t.py::a", "t.py::b"}) == (1, 2)  # bugs dropped, spec entries dropped
    first, third = manifest["bugs"]
    assert (first["FAIL_TO_PASS"], first["messages"], "checked" in first) == (["t.py::a"], {"t.py::a": "m"}, False)
    assert third["checked"] == {"judge": "x"}  # its spec did not change: its check still stands


@pytest.mark.slow
def test_rejudge_runs_a_manifests_tests_under_the_judge_and_rewrites_it_only_when_needed(tmp_path, capsys, monkeypatch):
    from wharf.tasks.factory import rejudge

    out = _tinycalc(tmp_path, monkeypatch)
    assert _cli(["tinycalc==0.1", "--out", str(out), "--max", "2", "--seed", "1", "--no-check"], capsys)[0] == 0
    path = out / "manifests" / "tinycalc-0.1.seed1.json"
    manifest = json.loads(path.read_text())
    manifest["bugs"][0]["PASS_TO_PASS"].append("tests/test_calc.py::test_not_there")  # a test the judge never passes
    path.write_text(json.dumps(manifest))
    assert rejudge.main([str(path)]) == 0
    assert "1 spec entries and 0 of" in capsys.readouterr().out
    again = json.loads(path.read_text())
    assert again["bugs"][0]["PASS_TO_PASS"] == manifest["bugs"][0]["PASS_TO_PASS"][:-1]
    assert again["stats"]["rejudged"]["entries_dropped"] == 1
    before = path.read_text()
    assert rejudge.main([str(path)]) == 0 and path.read_text() == before  # nothing to change: not rewritten


@pytest.mark.slow
def test_a_make_resumes_checking_only_bugs_without_a_pass_and_checked_only_makes_just_the_passed(
        tmp_path, capsys, monkeypatch):
    """A bug holding a pass of today's judge is not checked again (of tier 2 too where the sample
    wants it); each pass is in the manifest as soon as it is made; --checked-only makes only
    the passed bugs' tasks and leaves the manifest as it was. The checker here stands in for
    wharf tasks check (the dispatcher test above runs the real one) and counts its calls."""
    from types import SimpleNamespace

    from wharf.tasks.factory.verify import judge_digest

    out = _tinycalc(tmp_path, monkeypatch)
    manifests = out / "manifests"
    path = manifests / "tinycalc-0.1.seed1.json"
    calls = []

    def checker(task, runs, redteam):
        calls.append((task.name, redteam))
        assert json.loads(path.read_text())["bugs"]  # the manifest is there before the first check ends
        return SimpleNamespace(ok=True, reasons=[], seconds={"judge": 1.0})

    def make(*args: str, check=checker) -> int:
        return cli.main(["tinycalc==0.1", "--manifests", str(manifests), "--seed", "1", *args], check=check)

    assert _cli(["tinycalc==0.1", "--out", str(out), "--max", "2", "--seed", "1", "--no-check"], capsys)[0] == 0
    assert make("--out", str(out), "--max", "1", "--redteam", "0") == 0 and len(calls) == 1
    first = json.loads(path.read_text())["bugs"][0]["checked"]
    assert (first["judge"], first["tier2"]) == (judge_digest(), False)
    assert make("--out", str(out), "--max", "2", "--redteam", "0") == 0
    assert len(calls) == 2 and calls[1][0] != calls[0][0]  # the second bug only
    assert "1 of 2 tasks hold a check under today's judge" in capsys.readouterr().err
    assert make("--out", str(out), "--max", "2", "--redteam", "1") == 0
    assert calls[2:] == [(calls[0][0], True)]  # the sample's tier 2 was missing: that one alone again

    before = path.read_text()
    bugs = json.loads(before)["bugs"]
    bugs[1]["checked"]["judge"] = "0ld0ld0ld0ld"  # passed under another judge: not made
    path.write_text(json.dumps({**json.loads(before), "bugs": bugs}))
    before = path.read_text()
    assert make("--out", str(tmp_path / "train"), "--checked-only", check=None) == 0
    made = sorted(p.name for p in (tmp_path / "train").iterdir() if p.name.startswith("tinycalc"))
    assert made == [calls[0][0]] and path.read_text() == before and len(calls) == 3
    assert make("--out", str(tmp_path / "none"), "--seed", "2", "--checked-only") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (f"wharf tasks make: tinycalc==0.1: no manifest at {manifests}/"
                                               "tinycalc-0.1.seed2.json: run wharf tasks make without --checked-only first")


@pytest.mark.slow
def test_a_test_that_needs_a_test_left_out_of_the_spec_is_not_in_the_spec(tmp_path, capsys, monkeypatch):
    """test_uses needs what test_setup (another file, covering nothing) sets: in a hunt's selection
    it fails whatever the mutation, and its spec would fail the fixed code too. The control run
    of the spec's tests on the pristine source keeps it out; test_value still makes the bugs."""
    src = tmp_path / "src"
    (src / "ordcalc").mkdir(parents=True)
    (src / "ordcalc" / "__init__.py").write_text("REG = {}\n\n\ndef double(x):\n    return x * 2\n")
    (src / "tests").mkdir()
    (src / "tests" / "test_a_setup.py").write_text("import ordcalc\n\n\ndef test_setup():\n    ordcalc.REG['k'] = 4\n")
    (src / "tests" / "test_b_uses.py").write_text(
        "import ordcalc\n\n\ndef test_uses():\n    assert ordcalc.double(2) == ordcalc.REG['k']\n\n\n"
        "def test_other():\n    assert ordcalc.REG.get('k') == 4\n")
    (src / "tests" / "test_c_value.py").write_text(
        "from ordcalc import double\n\n\ndef test_value():\n    assert double(3) == 6\n")
    cache = tmp_path / "cache"
    monkeypatch.setenv("WHARF_CACHE", str(cache))
    _sdist(cache, src, "ordcalc")
    _offline_env(cache, "ordcalc-0.1")
    out = tmp_path / "out"
    code, err = _cli(["ordcalc==0.1", "--out", str(out), "--no-check"], capsys)
    assert code == 0, err
    bugs = json.loads((out / "manifests" / "ordcalc-0.1.seed0.json").read_text())["bugs"]
    assert bugs and all(b["FAIL_TO_PASS"] == ["tests/test_c_value.py::test_value"] for b in bugs), bugs
    assert not any("test_b_uses" in t for b in bugs for t in b["PASS_TO_PASS"])


def test_two_makes_of_one_manifest_take_turns(tmp_path, monkeypatch):
    """The second waits (and says so) until the first has written its manifest: each would
    otherwise write back its own copy and lose the other's check records."""
    import threading

    monkeypatch.setenv("WHARF_CACHE", str(tmp_path / "cache"))
    path, order, said = tmp_path / "m" / "pkg-1.0.seed0.json", [], []

    def second():
        with cli.make.manifest_lock(path, said.append):
            order.append("second")

    with cli.make.manifest_lock(path):
        t = threading.Thread(target=second)
        t.start()
        deadline = time.monotonic() + 10
        while not said and time.monotonic() < deadline:
            time.sleep(0.01)
        order.append("first")
    t.join(10)
    assert order == ["first", "second"] and said == ["pkg-1.0.seed0.json: another wharf tasks make holds it; waiting"]
    assert not (tmp_path / "m").exists()  # the lock lies in the cache, not beside the manifests


def test_a_task_dir_the_checker_calls_malformed_is_a_failed_check_not_the_end_of_the_run(tmp_path):
    from wharf.tasks.check.taskformat import TaskFormatError
    from wharf.tasks.factory.verify import check_task

    def checker(task, runs, redteam):
        raise TaskFormatError(f"{task}/environment/Dockerfile: a Docker task")

    assert check_task(tmp_path, checker) == (False, f"not a well-formed task dir: {tmp_path}/environment/Dockerfile: "
                                             "a Docker task", None)


def test_stats_counts_only_the_checks_made_under_the_judge_as_it_is(tmp_path, capsys):
    from wharf.tasks.factory import stats
    from wharf.tasks.factory.verify import judge_digest

    bugs = [{"checked": {"judge": judge_digest(), "seconds": 30.0}}, {"checked": {"judge": "0ld0ld0ld0ld", "seconds": 9.0}},
            {"checked": {"judge": judge_digest(), "seconds": 40.0}}, {},
            {"checked": {"judge": judge_digest(), "seconds": 300.0, "tier2": True}}]
    (tmp_path / "p-1.seed0.json").write_text(json.dumps({
        "package": "p", "version": "1", "bugs": bugs,
        "stats": {"passing": 5, "covered_functions": 2, "tried": 8, "kept": 4, "seconds": 40.0}}))
    assert stats.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[-1] == "3"  # the checked column
    assert out[-1] == (f"3 passed wharf tasks check under the judge as it is now ({judge_digest()}), 1 of them "
                       "with the red team (tier 2); a check 35.0 s (median), with the red team 300.0 s")


def test_rejudge_of_a_corrupt_manifest_says_which_file_and_leaves_it_as_it_was(tmp_path, capsys):
    from wharf.tasks.factory import rejudge

    bad = tmp_path / "p-1.seed0.json"
    bad.write_text('{"package": "p", "version"')
    assert rejudge.main([str(bad), str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith(f"{bad}: ") and err[1].startswith(f"{tmp_path / 'missing.json'}: ")
    assert bad.read_text() == '{"package": "p", "version"'
