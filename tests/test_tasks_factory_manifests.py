"""wharf tasks make's manifests over time: the pass of `wharf tasks check` recorded on each bug
(under the judges' code as it is), a make that resumes and grows without checking a bug twice,
--checked-only, the control run that keeps order-dependent tests out of a spec, one writer a
manifest, rejudge and stats. Offline, on the bundled tinycalc-0.1 (tests/factory_kit.py)."""
from __future__ import annotations

import json
import shutil
import time

import pytest

from tests.factory_kit import FIXTURE, offline_env, put_sdist, run_cli, tinycalc_cache
from wharf.tasks.factory import cli


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
    out = tinycalc_cache(tmp_path, monkeypatch, src)
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

    out = tinycalc_cache(tmp_path, monkeypatch)
    assert run_cli(["tinycalc==0.1", "--out", str(out), "--max", "2", "--seed", "1", "--no-check"], capsys)[0] == 0
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

    from wharf.tasks.factory.verify import env_digest, judge_digest

    out = tinycalc_cache(tmp_path, monkeypatch)
    manifests = out / "manifests"
    path = manifests / "tinycalc-0.1.seed1.json"
    calls = []

    def checker(task, runs, redteam):
        calls.append((task.name, redteam))
        assert json.loads(path.read_text())["bugs"]  # the manifest is there before the first check ends
        return SimpleNamespace(ok=True, reasons=[], seconds={"judge": 1.0})

    def make(*args: str, check=checker) -> int:
        return cli.main(["tinycalc==0.1", "--manifests", str(manifests), "--seed", "1", *args], check=check)

    assert run_cli(["tinycalc==0.1", "--out", str(out), "--max", "2", "--seed", "1", "--no-check"], capsys)[0] == 0
    assert make("--out", str(out), "--max", "1", "--redteam", "0") == 0 and len(calls) == 1
    first = json.loads(path.read_text())["bugs"][0]["checked"]
    assert (first["judge"], first["tier2"], first["env"]) == (judge_digest(), False, env_digest(json.loads(path.read_text())))
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
    path.write_text(json.dumps({**json.loads(before), "env": ["tinycalc-dep==2"]}))  # a lock edited by hand
    monkeypatch.setattr(cli.make, "prepare", lambda *a: pytest.fail("an env built for a make that can only fail"))
    assert make("--out", str(tmp_path / "relocked"), "--checked-only") == 2  # its records name the old lock
    assert f"and env lock ({env_digest({'env': ['tinycalc-dep==2']})})" in capsys.readouterr().err
    path.write_text(before)
    assert make("--out", str(tmp_path / "none"), "--seed", "2", "--checked-only") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (f"wharf tasks make: tinycalc==0.1: no manifest at {manifests}/"
                                               "tinycalc-0.1.seed2.json: run wharf tasks make without --checked-only first")


def test_a_manifest_locks_its_env_and_an_env_that_differs_from_the_lock_is_made_again(tmp_path, monkeypatch):
    """freeze: every distribution in the env, name==version, but the package's own metadata and
    pip. An env that matches the lock is kept as it is; one that differs is made again from the
    lock (--no-deps: exactly it), aside, and swapped in only once made: a failed build leaves
    the old env. The index is not reached here: the install stands in, as a venv that sees
    this venv's packages."""
    from wharf.tasks.factory import env as envs
    from wharf.tasks.factory.package import FactoryError, Package

    cache = tmp_path / "cache"
    monkeypatch.setenv("WHARF_CACHE", str(cache))
    offline_env(cache, "tinycalc-0.1")
    pkg = Package("tinycalc", "0.1", FIXTURE, ".", ["tests"])
    envs.write_metadata(pkg, pkg.env)
    lock = envs.freeze(pkg)
    assert f"pytest=={pytest.__version__}" in lock and lock == sorted(lock)
    assert not [p for p in lock if p.split("==")[0] in ("tinycalc", "pip")]

    said, installs = [], []
    inode = pkg.env.stat().st_ino
    assert envs.build_env(pkg, said.append, lock) == pkg.env and pkg.env.stat().st_ino == inode and not said

    host_pth = next((pkg.env / "lib").glob("python3*/site-packages/wharf_host.pth"))

    def install(ok: bool):
        def fake(py, reqs, log):
            installs.append(reqs)
            site = next((py.parent.parent / "lib").glob("python3*/site-packages"))
            shutil.copy(host_pth, site / "wharf_host.pth")
            return ok
        return fake

    other = lock + ["wharf-not-in-this-env==1.0"]
    monkeypatch.setattr(envs, "_install", install(False))
    with pytest.raises(FactoryError, match="the env its manifest locks .* does not install"):
        envs.build_env(pkg, said.append, other)
    assert said == ["tinycalc-0.1: its env differs from the manifest's lock (`env`): made again from the lock"]
    assert installs[0][0] == "--no-deps" and "wharf-not-in-this-env==1.0" in installs[0]
    assert pkg.env.stat().st_ino == inode and [p.name for p in pkg.env.parent.iterdir()] == ["tinycalc-0.1"]

    monkeypatch.setattr(envs, "_install", install(True))
    assert envs.build_env(pkg, said.append, other) == pkg.env
    assert pkg.env.stat().st_ino != inode and [p.name for p in pkg.env.parent.iterdir()] == ["tinycalc-0.1"]
    assert envs.freeze(pkg) == lock  # what the stand-in installed: this venv's packages, as before


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
    put_sdist(cache, src, "ordcalc")
    offline_env(cache, "ordcalc-0.1")
    out = tmp_path / "out"
    code, err = run_cli(["ordcalc==0.1", "--out", str(out), "--no-check"], capsys)
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


def test_stats_counts_only_the_checks_made_under_the_judge_and_env_lock_as_they_are(tmp_path, capsys):
    from wharf.pipeline.tasks import main as tasks_main
    from wharf.tasks.factory.verify import env_digest, judge_digest

    env = env_digest({"env": ["dep==1"]})
    bugs = [{"checked": {"judge": judge_digest(), "env": env, "seconds": 30.0}},
            {"checked": {"judge": "0ld0ld0ld0ld", "env": env, "seconds": 9.0}},
            {"checked": {"judge": judge_digest(), "env": env, "seconds": 40.0}}, {},
            {"checked": {"judge": judge_digest(), "env": env_digest({"env": ["dep==0.9"]}), "seconds": 20.0}},
            {"checked": {"judge": judge_digest(), "env": env, "seconds": 300.0, "tier2": True}}]
    (tmp_path / "p-1.seed0.json").write_text(json.dumps({
        "package": "p", "version": "1", "env": ["dep==1"], "bugs": bugs,
        "stats": {"passing": 5, "covered_functions": 2, "tried": 8, "kept": 4, "seconds": 40.0}}))
    assert tasks_main(["stats", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[-1] == "3"  # the checked column
    assert out[-1] == (f"3 passed wharf tasks check under the judge as it is now ({judge_digest()}), in their "
                       "locked envs, 1 of them "
                       "with the red team (tier 2); a check 35.0 s (median), with the red team 300.0 s")
    (tmp_path / "half.seed0.json").write_text('{"package": "q", "vers')
    (tmp_path / "other.json").write_text('{"package": "q"}')
    assert tasks_main(["stats", str(tmp_path)]) == 2  # named, left out; the good one still counted
    got = capsys.readouterr()
    assert got.err.splitlines() == [
        f"{tmp_path}/half.seed0.json: not a wharf tasks make manifest (Unterminated string starting at: line 1 "
        "column 18 (char 17)); left out of the figures",
        f"{tmp_path}/other.json: not a wharf tasks make manifest (no field 'stats'); left out of the figures"]
    assert got.out.splitlines()[-1].startswith("3 passed wharf tasks check")


def test_rejudge_of_a_corrupt_manifest_says_which_file_and_leaves_it_as_it_was(tmp_path, capsys):
    from wharf.tasks.factory import rejudge

    bad = tmp_path / "p-1.seed0.json"
    bad.write_text('{"package": "p", "version"')
    assert rejudge.main([str(bad), str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith(f"{bad}: ") and err[1].startswith(f"{tmp_path / 'missing.json'}: ")
    assert bad.read_text() == '{"package": "p", "version"'
