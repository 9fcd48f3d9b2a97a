"""SWE-Gym / SWE-bench rows -> harbor task dirs, loaded by harbor and verified by their real test.sh
(bash, no Docker) against a git-initialised toy repo standing in for /testbed."""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from wharf.tasks import swegym
from wharf.tasks.swegym import RowError, convert, parse_row

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "datasets" / "fixtures" / "swegym"
GYM_ROWS = FIX / "swegym_rows.jsonl"
BENCH_ROWS = FIX / "swebench_rows.jsonl"
ALL_IDS = ["facebookresearch__hydra-90001", "iterative__dvc-90002", "psf__requests-90003"]
ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HARBOR_TELEMETRY": "0"}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tasks")
    convert(GYM_ROWS, out)
    convert(BENCH_ROWS, out)
    return out


def test_task_dirs_load_in_harbor(tasks):
    from harbor.models.task.task import Task

    for iid in ALL_IDS:
        assert Task.is_valid_dir(tasks / iid), iid
        t = Task(tasks / iid)
        assert t.name == iid
        assert t.config.environment.workdir == "/testbed"
        assert t.config.metadata["instance_id"] == iid
        assert t.paths.discovered_test_path == tasks / iid / "tests" / "test.sh"
        assert t.paths.discovered_solve_path == tasks / iid / "solution" / "solve.sh"
        assert "<issue>" in t.instruction and "/testbed" in t.instruction
    gym = Task(tasks / "facebookresearch__hydra-90001")
    assert gym.config.environment.docker_image == "xingyaoww/sweb.eval.x86_64.facebookresearch_s_hydra-90001"
    assert gym.config.metadata["source"] == "swe-gym"
    bench = Task(tasks / "psf__requests-90003")
    assert bench.config.environment.docker_image == "swebench/sweb.eval.x86_64.psf_1776_requests-90003"
    assert (tasks / "psf__requests-90003" / "tests" / "eval.sh").is_file()
    assert "hints" not in gym.instruction.lower()  # hints_text is withheld, as in SWE-bench


def test_task_files_carry_the_row(tasks):
    d = tasks / "iterative__dvc-90002"
    row = _rows(GYM_ROWS)[1]
    assert (d / "solution" / "gold.patch").read_text() == row["patch"]
    assert (d / "tests" / "test.patch").read_text() == row["test_patch"]
    spec = json.loads((d / "tests" / "spec.json").read_text())
    assert spec["FAIL_TO_PASS"] == row["FAIL_TO_PASS"] and spec["log_parser"] == "parse_log_pytest"
    assert (d / "tests" / "grading.py").read_bytes() == swegym.GRADING_PY.read_bytes()
    assert "'pytest -rA tests/test_ops.py'" in (d / "tests" / "test.sh").read_text()
    # The 5.x eval_script gets its exit code recorded as swebench's make_test_spec does.
    ev = (tasks / "psf__requests-90003" / "tests" / "eval.sh").read_text()
    assert "SWEBENCH_TEST_EXIT_CODE=$?" in ev and 'echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"' in ev


def _toy_repo(where: Path) -> Path:
    out = subprocess.run(["bash", str(FIX / "make_toyrepo.sh"), str(where)], capture_output=True,
                         text=True, check=True, timeout=60)
    assert out.stdout.strip() == _rows(GYM_ROWS)[0]["base_commit"], "toy repo no longer matches the rows"
    return where


def _verify(task: Path, tmp: Path, prepare: str = "") -> dict:
    """Run the real solution/test scripts with bash against the toy repo; return reward.json."""
    repo = _toy_repo(tmp / "testbed")
    vdir = tmp / "verifier"
    env = {**ENV, "HOME": str(tmp), "WHARF_TESTBED": str(repo), "WHARF_VERIFIER_DIR": str(vdir),
           "WHARF_GRADING_PYTHON": sys.executable,
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    if prepare:
        subprocess.run(["bash", "-c", prepare], cwd=repo, env=env, check=True, timeout=60,
                       capture_output=True)
    p = subprocess.run(["bash", str(task / "tests" / "test.sh")], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert ">>>>> Test Exit Code:" in (vdir / "test_output.log").read_text()
    return json.loads((vdir / "reward.json").read_text())


@pytest.mark.parametrize("iid", ALL_IDS)
def test_real_test_sh_gold_patch_1_empty_patch_0(tasks, tmp_path, iid):
    task = tasks / iid
    gold = _verify(task, tmp_path / "gold", prepare=f"bash {shlex.quote(str(task / 'solution' / 'solve.sh'))}")
    assert gold["reward"] == 1.0 and gold["f2p_passed"] == gold["f2p_total"] > 0, gold
    empty = _verify(task, tmp_path / "empty")
    assert empty["reward"] == 0.0 and empty["f2p_passed"] == 0 and empty["log_ok"] == 1, empty
    assert empty["p2p_passed"] == empty["p2p_total"] == 2


def test_agent_edits_to_the_tests_are_undone(tasks, tmp_path):
    # An agent that deletes the failing test and plants the new test file still gets 0.0.
    tamper = ("printf 'def test_add():\\n    pass\\n' > tests/test_ops.py; "
              "printf 'def test_error_message():\\n    pass\\n' > tests/test_errors.py")
    r = _verify(tasks / "facebookresearch__hydra-90001", tmp_path, prepare=tamper)
    assert r["reward"] == 0.0 and r["f2p_passed"] == 0 and r["log_ok"] == 1


def test_agent_test_config_is_reset(tasks, tmp_path):
    # A conftest.py that marks every test passed, a pytest.ini deselecting the failing test and a
    # git hook config: all undone before the tests run, so the unfixed repo still gets 0.0.
    conftest = ("import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
                "def pytest_runtest_makereport(item, call):\n    rep = (yield).get_result()\n    rep.outcome = 'passed'\n")
    tamper = (f"printf %s {shlex.quote(conftest)} > conftest.py; cp conftest.py tests/conftest.py; "
              "printf '[pytest]\\naddopts = -p no:python\\n' > pytest.ini; "
              "git config core.fsmonitor 'touch /tmp/wharf-fsmonitor-ran; false'")
    r = _verify(tasks / "facebookresearch__hydra-90001", tmp_path, prepare=tamper)
    assert r["reward"] == 0.0 and r["f2p_passed"] == 0 and r["log_ok"] == 1, r
    assert not Path("/tmp/wharf-fsmonitor-ran").exists()


def test_cli_limit_ids_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "wharf.tasks.swegym", str(GYM_ROWS), str(out), "--limit", "1"],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in out.iterdir()) == ["facebookresearch__hydra-90001"]
    # Parquet as the hubs ship it: SWE-Gym with list<string> columns, SWE-bench with JSON strings.
    pq.write_table(pa.Table.from_pylist(_rows(GYM_ROWS)), tmp_path / "gym.parquet")
    pq.write_table(pa.Table.from_pylist(_rows(BENCH_ROWS)), tmp_path / "bench.parquet")
    written, _ = convert(tmp_path / "gym.parquet", tmp_path / "pq", ids=["iterative__dvc-90002"])
    written += convert(tmp_path / "bench.parquet", tmp_path / "pq")[0]
    assert [w.name for w in written] == ["iterative__dvc-90002", "psf__requests-90003"]
    spec = json.loads((tmp_path / "pq" / "iterative__dvc-90002" / "tests" / "spec.json").read_text())
    assert spec["FAIL_TO_PASS"] == ["tests/test_ops.py::test_mean"]
    with pytest.raises(RowError, match="no row with instance_id nope__nope-1"):
        convert(GYM_ROWS, tmp_path / "x", ids=["nope__nope-1"])


def test_regenerating_replaces_the_dir_and_leaves_no_temp_dirs(tmp_path):
    convert(GYM_ROWS, tmp_path)
    (tmp_path / "iterative__dvc-90002" / "stale.txt").write_text("old")
    convert(GYM_ROWS, tmp_path)
    assert not (tmp_path / "iterative__dvc-90002" / "stale.txt").exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == ALL_IDS[:2]


def _bad(tmp_path: Path, **over) -> Path:
    row = _rows(GYM_ROWS)[1]
    row.update(over)
    row = {k: v for k, v in row.items() if v is not ...}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(_rows(GYM_ROWS)[0]) + "\n" + json.dumps(row) + "\n")
    return path


@pytest.mark.parametrize("over, words", [
    ({"patch": ...}, ["'patch'"]),
    ({"FAIL_TO_PASS": "tests/x.py::t"}, ["'FAIL_TO_PASS'", "not a JSON list"]),
    ({"FAIL_TO_PASS": []}, ["'FAIL_TO_PASS'", "empty"]),
    ({"PASS_TO_PASS": [1, 2]}, ["'PASS_TO_PASS'"]),
    ({"base_commit": "main"}, ["'base_commit'"]),
    ({"test_patch": "just text"}, ["'test_patch'", "not a git diff"]),
    ({"instance_id": "../escape"}, ["'instance_id'"]),
    ({"repo": "someone/unknown"}, ["'repo'", "test_cmd"]),
    ({"repo": "django/django"}, ["'repo'", "eval_script"]),
    ({"eval_type": "maybe"}, ["'eval_type'"]),
    ({"log_parser": "parse_log_nope"}, ["'log_parser'"]),
])
def test_bad_row_names_file_row_field_and_writes_nothing(tmp_path, capsys, over, words):
    # The CLI's main in this process (a child process per row cost ~10 s of imports each);
    # test_cli_limit_ids_and_parquet runs the real `python -m`.
    from wharf.tasks.swegym.cli import main

    rows = _bad(tmp_path, **over)
    out = tmp_path / "out"
    assert main([str(rows), str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{rows}: row 2" in err and "nothing written" in err
    for w in words:
        assert w in err, err
    assert not out.exists() or not any(out.iterdir())  # the good row 1 was not written either


def test_skip_bad_writes_the_good_rows(tmp_path):
    rows = _bad(tmp_path, base_commit="xyz")
    written, errors = convert(rows, tmp_path / "out", skip_bad=True)
    assert [w.name for w in written] == ["facebookresearch__hydra-90001"]
    assert len(errors) == 1 and "iterative__dvc-90002" in errors[0] and "'base_commit'" in errors[0]


def test_unreadable_rows_file_is_named(tmp_path):
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"instance_id": "a"}\n{not json\n')
    with pytest.raises(RowError, match=r"rows.jsonl: line 2 is not valid JSON"):
        convert(bad, tmp_path / "o")
    with pytest.raises(RowError, match="unknown rows format"):
        convert(FIX / "make_toyrepo.sh", tmp_path / "o")


def test_test_commands_per_repo():
    row = dict(_rows(GYM_ROWS)[1])
    mypy = dict(row, instance_id="python__mypy-90009", repo="python/mypy",
                test_patch="diff --git a/test-data/unit/check-x.test b/test-data/unit/check-x.test\n",
                FAIL_TO_PASS=["mypy/test/testcheck.py::TypeCheckSuite::check-x.test::testNew"],
                PASS_TO_PASS=["mypy/test/testcheck.py::TypeCheckSuite::check-x.test::testOld"])
    t = parse_row(mypy, "row")
    assert t.test_cmd == "pytest -n0 -rA mypy/test/testcheck.py -k 'testNew or testOld'"
    assert t.image == "xingyaoww/sweb.eval.x86_64.python_s_mypy-90009"
    conan = parse_row(dict(row, repo="conan-io/conan"), "row")
    assert conan.test_cmd.startswith("export PYTHONPATH=") and conan.test_cmd.endswith("tests/test_ops.py")
    custom = parse_row(dict(row, repo="me/mine", test_cmd="python -m pytest -rA"), "row")
    assert custom.test_cmd == "python -m pytest -rA tests/test_ops.py"
    # A SWE-bench row without eval_script: swebench's parser for the repo, SWE-bench image.
    bench = parse_row(dict(row, repo="astropy/astropy", FAIL_TO_PASS=json.dumps(row["FAIL_TO_PASS"])), "row")
    assert bench.source == "swe-bench" and bench.log_parser in ("parse_log_astropy", "parse_log_pytest_v2")
    assert bench.image == "swebench/sweb.eval.x86_64.iterative_1776_dvc-90002"
    assert parse_row(dict(row, image="my/img:1"), "row").image == "my/img:1"


def test_bake_grader_builds_from_dockerfile(tmp_path):
    from harbor.models.task.task import Task

    p = subprocess.run([sys.executable, "-m", "wharf.tasks.swegym", str(GYM_ROWS), str(tmp_path),
                        "--ids", "iterative__dvc-90002", "--bake-grader"],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    t = Task(tmp_path / "iterative__dvc-90002")
    assert t.config.environment.docker_image is None  # harbor builds the Dockerfile
    assert t.config.metadata["image"] == "xingyaoww/sweb.eval.x86_64.iterative_s_dvc-90002"
    docker = (tmp_path / "iterative__dvc-90002" / "environment" / "Dockerfile").read_text()
    assert docker.startswith("FROM xingyaoww/sweb.eval.x86_64.iterative_s_dvc-90002\n")
    assert "swebench==5.0.2" in docker and "/opt/wharf-grading" in docker
    assert "/opt/wharf-grading/bin/python" in (tmp_path / "iterative__dvc-90002" / "tests" / "test.sh").read_text()


def _trial(task: Path, agent: str, tmp: Path) -> dict:
    import asyncio

    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig

    cfg = TrialConfig(
        task=TaskConfig(path=task), trial_name=f"{task.name}__{agent}", trials_dir=tmp / "trials",
        agent=AgentConfig(name=agent),
        environment=EnvironmentConfig(import_path="wharf.collect.sandbox.bwrap:BwrapEnvironment",
                                      kwargs={"state_dir": str(tmp / "state")}))
    result = asyncio.run(_run(cfg))
    assert result.exception_info is None, result.exception_info
    return result.verifier_result.rewards


async def _run(cfg):
    from harbor.trial.trial import Trial

    return await (await Trial.create(cfg)).run()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
@pytest.mark.parametrize("iid", ["iterative__dvc-90002", "psf__requests-90003"])
def test_real_harbor_trials_in_bwrap_oracle_1_nop_0(tmp_path, monkeypatch, iid):
    # The generated task as harbor runs it, with the toy repo shipped in environment/ (the bwrap
    # sandbox copies it into the workdir, /testbed) instead of the eval image.
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")
    rows = GYM_ROWS if iid != "psf__requests-90003" else BENCH_ROWS
    (task,), _ = convert(rows, tmp_path / "tasks", ids=[iid])
    _toy_repo(task / "environment")
    toml = (task / "task.toml").read_text()
    # pytest, as in the image (the venv's real path: the sandbox shows no symlinked alias of it)
    venv_path = f"{os.path.realpath(Path(sys.executable).parent)}:/usr/local/bin:/usr/bin:/bin"
    (task / "task.toml").write_text(toml.replace("[verifier]\n", f'[verifier]\nenv = {{ PATH = "{venv_path}" }}\n'))
    oracle = _trial(task, "oracle", tmp_path / "oracle")
    assert (oracle["reward"], oracle["log_ok"]) == (1.0, 1), oracle
    nop = _trial(task, "nop", tmp_path / "nop")
    assert (nop["reward"], nop["log_ok"], nop["p2p_passed"]) == (0.0, 1, 2), nop
    verifier = tmp_path / "oracle" / "trials" / f"{iid}__oracle" / "verifier"
    assert json.loads((verifier / "grading.json").read_text())["resolved"] is True
