"""One row -> a SweTask: the row checked field by field, and what its task dir needs derived
(eval image, test command, log parser)."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from .rows import RowError, added_or_modified_py, patch_files, test_ids

# SWE-Gym repos: test command prefix (test files are appended). From the SWE-Gym fork's specs;
# `-n0` needs pytest-xdist, which those images have.
REPO_TEST_CMDS = {
    "getmoto/moto": "pytest -n0 -rA",
    "python/mypy": "pytest -n0 -rA",
    "conan-io/conan": "export PYTHONPATH=${PYTHONPATH:-}:$(pwd); pytest -n0 -rA",
    "dask/dask": "pytest -n0 -rA --color=no",
    "Project-MONAI/MONAI": "pytest -rA",
    "iterative/dvc": "pytest -rA",
    "bokeh/bokeh": "pytest -rA -n0",
    "modin-project/modin": "pytest -n0 -rA",
    "pydantic/pydantic": "pytest -rA --tb=short -vv -o console_output_style=classic --no-header",
    "pandas-dev/pandas": "pytest -rA --tb=long",
    "facebookresearch/hydra": "pytest -rA --tb=long",
    # SWE-bench repos that run plain pytest (fallback when a row has no eval_script).
    "pytest-dev/pytest": "pytest -rA",
    "psf/requests": "pytest -rA",
    "pallets/flask": "pytest -rA",
    "pydata/xarray": "pytest -rA",
    "pylint-dev/pylint": "pytest -rA",
    "pylint-dev/astroid": "pytest -rA",
    "scikit-learn/scikit-learn": "pytest -rA",
    "mwaskom/seaborn": "pytest --no-header -rA",
    "matplotlib/matplotlib": "pytest -rA",
    "astropy/astropy": "pytest -rA -vv -o console_output_style=classic --tb=no",
    "marshmallow-code/marshmallow": "pytest -rA",
    "sqlfluff/sqlfluff": "pytest -rA",
    "pvlib/pvlib-python": "pytest -rA",
    "pydicom/pydicom": "pytest -rA",
    "pyvista/pyvista": "pytest -rA",
}
# Repos whose tests ids are pytest ids but whose test patch holds data files, not test modules.
KEYWORD_REPOS = {"python/mypy"}
# Non-pytest runners: only their SWE-bench 5.x eval_script knows how to run them.
NEEDS_EVAL_SCRIPT = {"django/django", "sympy/sympy", "sphinx-doc/sphinx"}
REQUIRED = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement", "FAIL_TO_PASS")
INSTANCE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
COMMIT_RE = re.compile(r"^[0-9a-f]{7,40}$")


@dataclass
class SweTask:
    instance_id: str
    repo: str
    version: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    source: str  # swe-gym | swe-bench
    image: str
    log_parser: str
    eval_type: str
    eval_script: str | None  # 5.x rows: run as-is (with the exit code recorded)
    test_cmd: str | None  # derived command, when there is no eval_script
    test_files: list[str]  # files the test patch touches (reset before it is applied)


def swegym_image(instance_id: str) -> str:
    return f"xingyaoww/sweb.eval.x86_64.{instance_id.replace('__', '_s_')}".lower()


def swebench_image(instance_id: str) -> str:
    return f"swebench/sweb.eval.x86_64.{instance_id.replace('__', '_1776_')}".lower()


def _detect_source(row: dict) -> str:
    if any(row.get(k) for k in ("eval_script", "image", "environment_setup_commit")):
        return "swe-bench"
    return "swe-bench" if isinstance(row.get("FAIL_TO_PASS"), str) else "swe-gym"


def _swebench_parser(repo: str) -> str | None:
    """swebench's parser name for a known SWE-bench Python repo."""
    from swebench.harness.log_parsers import PARSER_REGISTRY
    from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY

    fn = MAP_REPO_TO_PARSER_PY.get(repo)
    return next((name for name, f in PARSER_REGISTRY.items() if f is fn), None) if fn else None


def _derive_test_cmd(repo: str, row: dict, test_patch: str, tests: list[str], where: str) -> str:
    prefix = row.get("test_cmd") or REPO_TEST_CMDS.get(repo)
    if not prefix:
        hint = ("its SWE-bench 5.x row carries an eval_script: use a 5.x dump"
                if repo in NEEDS_EVAL_SCRIPT else "add a 'test_cmd' field (e.g. 'pytest -rA') to the row")
        raise RowError(f"{where}: field 'repo': no known test command for {repo!r}; {hint}")
    id_files = list(dict.fromkeys(t.split("::", 1)[0] for t in tests if "::" in t))
    if repo in KEYWORD_REPOS:
        # mypy: ids look like mypy/test/testcheck.py::TypeCheckSuite::check-x.test::testCase
        names = list(dict.fromkeys(t.rsplit("::", 1)[-1] for t in tests))
        return f"{prefix} {' '.join(map(shlex.quote, id_files))} -k {shlex.quote(' or '.join(names))}"
    files = added_or_modified_py(test_patch) or id_files
    if not files:
        raise RowError(f"{where}: field 'test_patch': touches no .py test file and the test ids name none")
    return f"{prefix} {' '.join(map(shlex.quote, files))}"


def parse_row(row: object, where: str, source: str = "auto") -> SweTask:
    """Validate one row and derive everything a task dir needs."""
    if not isinstance(row, dict):
        raise RowError(f"{where}: a row must be an object, got {type(row).__name__}")
    iid = row.get("instance_id")
    if isinstance(iid, str) and iid:
        where = f"{where} ({iid})"
    for field in REQUIRED:
        value = row.get(field)
        if field == "FAIL_TO_PASS":
            continue
        if not isinstance(value, str) or not value.strip():
            raise RowError(f"{where}: field {field!r} must be a non-empty string, got {str(value)[:80]!r}")
    if "FAIL_TO_PASS" not in row:
        raise RowError(f"{where}: field 'FAIL_TO_PASS' is missing")
    if not INSTANCE_ID_RE.match(iid):
        raise RowError(f"{where}: field 'instance_id' {iid!r} is not usable as a directory name")
    if not COMMIT_RE.match(row["base_commit"]):
        raise RowError(f"{where}: field 'base_commit' {row['base_commit']!r} is not a git commit hash")
    for field in ("patch", "test_patch"):
        if not patch_files(row[field]):
            raise RowError(f"{where}: field {field!r} is not a git diff (no 'diff --git' header)")
    f2p = test_ids(row["FAIL_TO_PASS"], "FAIL_TO_PASS", where)
    p2p = test_ids(row.get("PASS_TO_PASS"), "PASS_TO_PASS", where)
    if not f2p:
        raise RowError(f"{where}: field 'FAIL_TO_PASS' is empty; nothing would tell a fix from no fix")

    src = _detect_source(row) if source == "auto" else source
    repo = row["repo"]
    eval_script = row.get("eval_script") or None
    if eval_script is not None and "End Test Output" not in eval_script:
        raise RowError(f"{where}: field 'eval_script' has no '>>>>> End Test Output' marker")
    log_parser = row.get("log_parser") or (
        "parse_log_pytest" if src == "swe-gym" else _swebench_parser(repo) or "parse_log_pytest")
    eval_type = row.get("eval_type") or "pass_and_fail"
    if eval_type not in ("pass_and_fail", "fail_only"):
        raise RowError(f"{where}: field 'eval_type' must be pass_and_fail or fail_only, got {eval_type!r}")
    from swebench.harness.log_parsers import PARSER_REGISTRY

    if log_parser not in PARSER_REGISTRY:
        raise RowError(f"{where}: field 'log_parser': {log_parser!r} is not a swebench parser")
    test_cmd = None if eval_script else _derive_test_cmd(repo, row, row["test_patch"], f2p + p2p, where)
    image = row.get("image") or (swegym_image(iid) if src == "swe-gym" else swebench_image(iid))
    return SweTask(
        instance_id=iid, repo=repo, version=str(row.get("version") or ""),
        base_commit=row["base_commit"], problem_statement=row["problem_statement"],
        patch=row["patch"], test_patch=row["test_patch"], fail_to_pass=f2p, pass_to_pass=p2p,
        source=src, image=image, log_parser=log_parser, eval_type=eval_type,
        eval_script=eval_script, test_cmd=test_cmd, test_files=patch_files(row["test_patch"]),
    )
