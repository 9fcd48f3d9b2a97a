"""A SweTask -> its harbor task dir, written atomically (built aside, then renamed into place).

The scripts come from templates/ (package data): `@@NAME@@` placeholders, filled in one pass so
that a filled-in value (a problem statement, a test command) is never itself rescanned.
"""
from __future__ import annotations

import json
import re
import shlex
import shutil
import tempfile
from importlib import resources
from pathlib import Path

from .spec import SweTask

_TASKS = Path(__file__).resolve().parents[1] / "tools"  # wharf/tasks/tools: graders other task sets use too
GRADING_PY = _TASKS / "grading.py"
TESTLOG_SH = _TASKS / "testlog.sh"
SWEBENCH_PIN = "5.0.2"  # the major version grading.py is written against
_PLACEHOLDER = re.compile(r"@@([A-Z_]+)@@")


def render(template: str, **values: str) -> str:
    """templates/<template> with every @@NAME@@ replaced by values[NAME] (all must be given)."""
    text = resources.files(__package__).joinpath("templates", template).read_text(encoding="utf-8")
    missing = sorted(set(_PLACEHOLDER.findall(text)) - set(values))
    if missing:
        raise KeyError(f"templates/{template}: no value for {missing}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


def task_toml(t: SweTask, agent_timeout: float, verifier_timeout: float, bake_grader: bool = False) -> str:
    meta = {
        "instance_id": t.instance_id, "repo": t.repo, "version": t.version,
        "base_commit": t.base_commit, "source": t.source, "log_parser": t.log_parser,
        "image": t.image, "category": "swe", "n_fail_to_pass": len(t.fail_to_pass), "n_pass_to_pass": len(t.pass_to_pass),
    }
    lines = ["[metadata]"]
    for k, v in meta.items():
        lines.append(f"{k} = {v if isinstance(v, int) else _toml_str(v)}")
    lines += [
        "", "[agent]", f"timeout_sec = {float(agent_timeout)}",
        "", "[verifier]", f"timeout_sec = {float(verifier_timeout)}",
        "", "[environment]",
        # Baked: harbor builds environment/Dockerfile (once per task, then docker's cache).
        "build_timeout_sec = 1800.0" if bake_grader else f"docker_image = {_toml_str(t.image)}",
        'workdir = "/testbed"', "",
    ]
    return "\n".join(lines)


def _eval_script_with_exit_code(script: str) -> str:
    from swebench.harness.utils import parse_eval_script, record_test_exit_code

    return "\n".join(["#!/bin/bash", "set -uxo pipefail", *record_test_exit_code(parse_eval_script(script))]) + "\n"


def dockerfile(t: SweTask, bake_grader: bool) -> str:
    lines = [f"FROM {t.image}"]
    if bake_grader:
        # Without this every verification pip-installs swebench (~84 packages) into a fresh
        # container; the eval images' conda base is a Python >= 3.10 that can hold it.
        lines.append("RUN /opt/miniconda3/bin/python3 -m venv /opt/wharf-grading && "
                     f"/opt/wharf-grading/bin/python -m pip install -q swebench=={SWEBENCH_PIN}")
    return "\n".join(lines + ["WORKDIR /testbed", ""])


def test_sh(t: SweTask, verifier_timeout: float) -> str:
    """The verifier: the row's eval_script when it has one, else our derived test run."""
    if t.eval_script:
        run = render("run_eval_script.sh")
    else:
        run = render("run_derived.sh", TEST_CMD=shlex.quote(t.test_cmd))
    return render("test.sh", RUN=run.rstrip("\n"), IID=t.instance_id, SOURCE=t.source, PIN=SWEBENCH_PIN,
                  BASE_COMMIT=t.base_commit, TEST_FILES=" ".join(map(shlex.quote, t.test_files)),
                  TEST_TIMEOUT=str(max(60, int(verifier_timeout) - 120)))


def _write_tests(t: SweTask, tests: Path, verifier_timeout: float) -> None:
    tests.mkdir()
    shutil.copyfile(GRADING_PY, tests / "grading.py")
    spec = {"instance_id": t.instance_id, "repo": t.repo, "version": t.version,
            "FAIL_TO_PASS": t.fail_to_pass, "PASS_TO_PASS": t.pass_to_pass,
            "log_parser": t.log_parser, "eval_type": t.eval_type}
    (tests / "spec.json").write_text(json.dumps(spec, indent=2) + "\n")
    if t.eval_script:
        (tests / "eval.sh").write_text(_eval_script_with_exit_code(t.eval_script))
    else:
        shutil.copyfile(TESTLOG_SH, tests / "testlog.sh")
        (tests / "test.patch").write_text(t.test_patch)
    (tests / "test.sh").write_text(test_sh(t, verifier_timeout))
    (tests / "test.sh").chmod(0o755)


def _fill(t: SweTask, tmp: Path, agent_timeout: float, verifier_timeout: float, bake_grader: bool) -> None:
    (tmp / "environment").mkdir()
    (tmp / "environment" / "Dockerfile").write_text(dockerfile(t, bake_grader))
    (tmp / "task.toml").write_text(task_toml(t, agent_timeout, verifier_timeout, bake_grader))
    (tmp / "instruction.md").write_text(render("instruction.md", PROBLEM=t.problem_statement.strip(), REPO=t.repo,
                                               COMMIT=t.base_commit))
    sol = tmp / "solution"
    sol.mkdir()
    (sol / "gold.patch").write_text(t.patch)
    (sol / "solve.sh").write_text(render("solve.sh", IID=t.instance_id))
    (sol / "solve.sh").chmod(0o755)
    _write_tests(t, tmp / "tests", verifier_timeout)


def write_task(t: SweTask, out_dir: Path, agent_timeout: float = 1800, verifier_timeout: float = 1800,
               bake_grader: bool = False) -> Path:
    """Write one task dir atomically (built aside, then renamed over any old one)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / t.instance_id
    tmp = Path(tempfile.mkdtemp(prefix=f".{t.instance_id}.", dir=out_dir))
    try:
        _fill(t, tmp, agent_timeout, verifier_timeout, bake_grader)
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{t.instance_id}.old.", dir=out_dir))
            final.rename(old / "x")
            tmp.rename(final)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
