"""Turn SWE-Gym / SWE-bench rows into harbor task dirs on the official eval images.

    python -m collect.tasks.swegym ROWS_FILE OUT_DIR [--limit N] [--ids ID ...]
        [--source auto|swe-gym|swe-bench] [--agent-timeout S] [--verifier-timeout S] [--skip-bad]
        [--bake-grader]

ROWS_FILE: .jsonl, .json (a list) or .parquet, as the user downloaded it. SWE-Gym stores
FAIL_TO_PASS/PASS_TO_PASS as lists, SWE-bench as JSON strings; both are accepted. SWE-bench 5.x
rows may carry eval_script, image, log_parser, eval_type, which are used as given.

One dir per row, OUT_DIR/<instance_id>/:
    task.toml            [environment].docker_image (repo at /testbed), timeouts, [metadata]
    instruction.md       the problem statement (hints are withheld, as in SWE-bench)
    environment/Dockerfile   FROM the same image (harbor wants an environment/ dir); with
                         --bake-grader it also installs swebench into /opt/wharf-grading and
                         task.toml names no docker_image, so harbor builds it (once per task)
    solution/solve.sh    applies solution/gold.patch to /testbed (harbor's oracle agent)
    tests/test.sh        resets the test files, applies tests/test.patch, runs the tests between
                         SWE-bench markers with the exit code recorded (testlog.sh), grades with
                         tests/grading.py + tests/spec.json into /logs/verifier/reward.json
    tests/eval.sh        only for rows with an eval_script (5.x): run instead of the steps above

Test commands of SWE-Gym rows (no swebench release knows them; they follow the SWE-Gym fork's
specs): see REPO_TEST_CMDS. Most are pytest on the .py files the test patch touches; mypy's
tests are data files, so it runs the test modules named in the test ids with `-k <case names>`.
A row may carry `test_cmd` (our extension) to override the command for an unknown repo.

test.sh knobs (env vars), for images without Docker and for tests: WHARF_TESTBED (/testbed),
WHARF_VERIFIER_DIR (/logs/verifier), WHARF_GRADING_PYTHON (a Python >= 3.10 with swebench
5.x; else /opt/wharf-grading (baked) or another is found, or swebench==5.0.2 is pip-installed
into /tmp/wharf-grading: that needs the network in the verifier and takes a while),
WHARF_TEST_TIMEOUT (seconds; default verifier timeout - 120).

A bad row is reported by file, row number, instance_id and field; nothing is written unless
every selected row is good (or --skip-bad). Each task dir is built aside and renamed into place.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

GRADING_PY = Path(__file__).with_name("grading.py")
SWEBENCH_PIN = "5.0.2"  # the major version grading.py is written against
TESTLOG_SH = Path(__file__).with_name("testlog.sh")

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
# swebench's NON_TEST_EXTS: files of a test patch that are not test modules.
NON_TEST_EXTS = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")

REQUIRED = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement", "FAIL_TO_PASS")
INSTANCE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
COMMIT_RE = re.compile(r"^[0-9a-f]{7,40}$")


class RowError(ValueError):
    """A row that cannot become a task; the message names file, row, instance and field."""


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


# ---------------------------------------------------------------- reading rows

def read_rows(path: Path) -> list[dict]:
    """Rows of a .jsonl, .json or .parquet file, as dicts (errors name the file and line)."""
    if not path.is_file():
        raise RowError(f"{path}: no such file (give a .jsonl, .json or .parquet of SWE-Gym/SWE-bench rows)")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow raises several types for a bad file
            raise RowError(f"{path}: not a readable parquet file ({e})") from e
    text = path.read_text(encoding="utf-8")
    if suffix == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise RowError(f"{path}: not valid JSON ({e})") from e
        if not isinstance(rows, list):
            raise RowError(f"{path}: a .json rows file must hold a list of objects")
        return rows
    if suffix != ".jsonl":
        raise RowError(f"{path}: unknown rows format {suffix!r}; use .jsonl, .json or .parquet")
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise RowError(f"{path}: line {n} is not valid JSON ({e})") from e
    return rows


def _tests(value, field: str, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):  # SWE-bench: a JSON string
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise RowError(f"{where}: field {field!r} is a string but not a JSON list ({e})") from e
    if hasattr(value, "tolist"):  # numpy arrays from parquet readers
        value = value.tolist()
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise RowError(f"{where}: field {field!r} must be a list of test ids, got {str(value)[:120]!r}")
    return value


def patch_files(patch: str) -> list[str]:
    """Paths a unified git diff touches (both sides of a rename), in order."""
    files: list[str] = []
    for m in re.finditer(r"^diff --git a/(\S+) b/(\S+)$", patch, re.M):
        for f in m.groups():
            if f not in files:
                files.append(f)
    return files


def _added_or_modified_py(patch: str) -> list[str]:
    """Test modules the test patch leaves in the tree (deleted files cannot be run)."""
    out = []
    for block in re.split(r"^(?=diff --git )", patch, flags=re.M):
        m = re.match(r"diff --git a/(\S+) b/(\S+)", block)
        if not m or re.search(r"^deleted file mode", block, re.M):
            continue
        path = m.group(2)
        if path.endswith(".py") and not path.endswith(NON_TEST_EXTS) and path not in out:
            out.append(path)
    return out


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
    files = _added_or_modified_py(test_patch) or id_files
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
    f2p = _tests(row["FAIL_TO_PASS"], "FAIL_TO_PASS", where)
    p2p = _tests(row.get("PASS_TO_PASS"), "PASS_TO_PASS", where)
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


# ---------------------------------------------------------------- writing task dirs

TEST_SH = r"""#!/bin/bash
# Verifier of @@IID@@ (@@SOURCE@@), generated by collect.tasks.swegym.
# Reset the test files, apply the test patch, run the tests between SWE-bench markers with the
# exit code recorded, grade with grading.py (swebench @@PIN@@) into reward.json.
set -uo pipefail
TESTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TESTBED="${WHARF_TESTBED:-/testbed}"
VERIFIER_DIR="${WHARF_VERIFIER_DIR:-/logs/verifier}"
LOG="$VERIFIER_DIR/test_output.log"
BASE_COMMIT=@@BASE_COMMIT@@
TEST_FILES=(@@TEST_FILES@@)
export WHARF_TEST_TIMEOUT="${WHARF_TEST_TIMEOUT:-@@TEST_TIMEOUT@@}"
# The repo may belong to another user than the verifier: trust it without touching ~/.gitconfig.
# Nor run anything the agent put in .git/config (fsmonitor, hooks) when we call git.
export GIT_CONFIG_COUNT=3 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*' \
    GIT_CONFIG_KEY_1=core.fsmonitor GIT_CONFIG_VALUE_1=false GIT_CONFIG_KEY_2=core.hooksPath GIT_CONFIG_VALUE_2=/dev/null
unset PYTEST_ADDOPTS PYTEST_PLUGINS
mkdir -p "$VERIFIER_DIR"
: > "$LOG"

# A Python >= 3.10 with swebench 5.x for grading.py (the repo's own env may be older).
grading_python() {
    local py
    if [[ -n "${WHARF_GRADING_PYTHON:-}" ]]; then  # given: use it or fail, never install
        "$WHARF_GRADING_PYTHON" -c 'import swebench' >/dev/null 2>&1 && echo "$WHARF_GRADING_PYTHON"
        return
    fi
    # WHARF_PYTHON: the project venv the bwrap sandbox exports.
    for py in /opt/wharf-grading/bin/python "${WHARF_PYTHON:-}" /tmp/wharf-grading/bin/python /opt/miniconda3/bin/python3 python3; do
        [[ -n "$py" ]] && command -v "$py" >/dev/null 2>&1 || continue
        "$py" -c 'import sys, swebench; assert sys.version_info >= (3, 10) and swebench.__version__.startswith("5.")' \
            >/dev/null 2>&1 && { echo "$py"; return 0; }
    done
    for py in /opt/miniconda3/bin/python3 python3; do
        command -v "$py" >/dev/null 2>&1 || continue
        "$py" -c 'import sys; assert sys.version_info >= (3, 10)' >/dev/null 2>&1 || continue
        echo "test.sh: installing swebench==@@PIN@@ into /tmp/wharf-grading" >&2
        "$py" -m venv /tmp/wharf-grading >&2 &&
            /tmp/wharf-grading/bin/python -m pip install -q "swebench==@@PIN@@" >&2 &&
            { echo /tmp/wharf-grading/bin/python; return 0; }
    done
    return 1
}

@@RUN@@

if ! PY="$(grading_python)"; then
    # No reward file: harbor records a verifier error rather than a wrong 0.0.
    echo "test.sh: no Python >= 3.10 with swebench @@PIN@@ (set WHARF_GRADING_PYTHON)" >&2
    exit 2
fi
"$PY" "$TESTS_DIR/grading.py" --spec "$TESTS_DIR/spec.json" --log "$LOG" --out "$VERIFIER_DIR"
"""

RUN_DERIVED = r""". "$TESTS_DIR/testlog.sh"
# The eval images keep the repo's env in conda env `testbed`.
if [[ -f /opt/miniconda3/bin/activate ]]; then
    source /opt/miniconda3/bin/activate && conda activate testbed
fi

# The agent may have edited the tests: put every file of the test patch back to the base commit
# (files the patch creates are removed), so the patch applies to what it was written against.
reset_test_files() {
    local f ok=0
    for f in "${TEST_FILES[@]}"; do
        if git cat-file -e "$BASE_COMMIT:$f" 2>/dev/null; then
            git checkout -q "$BASE_COMMIT" -- "$f" || ok=1
        else
            rm -f -- "$f"
        fi
    done
    return $ok
}

# Test configuration the agent planted or changed anywhere in the repo (conftest.py, ini files,
# sitecustomize.py, .pth files) goes back to the base commit too: it decides how tests run.
reset_test_config() {
    local f ok=0
    while IFS= read -r -d '' f; do
        case "${f##*/}" in
            conftest.py|pytest.ini|tox.ini|setup.cfg|pyproject.toml|sitecustomize.py|usercustomize.py|*.pth)
                if git cat-file -e "$BASE_COMMIT:$f" 2>/dev/null; then
                    git checkout -q "$BASE_COMMIT" -- "$f" || ok=1
                else
                    rm -f -- "$f"
                fi;;
        esac
    done < <(git diff -z --name-only "$BASE_COMMIT"; git ls-files -z --others)
    return $ok
}

if ! cd "$TESTBED"; then
    echo ">>>>> Reset Failed" | tee -a "$LOG"
elif ! reset_test_config || ! reset_test_files; then
    echo ">>>>> Reset Failed" | tee -a "$LOG"
elif ! git apply -v "$TESTS_DIR/test.patch"; then
    echo ">>>>> Patch Apply Failed" | tee -a "$LOG"
else
    wharf_run_tests "$LOG" @@TEST_CMD@@
    reset_test_files
fi"""

RUN_EVAL_SCRIPT = r"""# A SWE-bench 5.x eval_script (exit code recording added as swebench's make_test_spec does).
EVAL="$TESTS_DIR/eval.sh"
if [[ "$TESTBED" != /testbed ]]; then
    EVAL="$(mktemp)"
    trap 'rm -f "$EVAL"' EXIT
    sed "s#/testbed#$TESTBED#g" "$TESTS_DIR/eval.sh" > "$EVAL"
fi
timeout --kill-after=10 "$WHARF_TEST_TIMEOUT" bash "$EVAL" 2>&1 | tee -a "$LOG"
code=${PIPESTATUS[0]}
if [[ $code == 124 || $code == 137 ]]; then
    echo ">>>>> Tests Timed Out" | tee -a "$LOG"
fi"""

SOLVE_SH = r"""#!/bin/bash
# Oracle for @@IID@@: apply the gold patch to the repo.
set -euo pipefail
SOLUTION_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "${WHARF_TESTBED:-/testbed}"
export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*'
git apply -v "$SOLUTION_DIR/gold.patch" || patch --batch --fuzz=5 -p1 -i "$SOLUTION_DIR/gold.patch"
"""

INSTRUCTION = """<issue>
{problem}
</issue>

The repository `{repo}` is checked out at /testbed (commit {commit}). Change its non-test
source files so that the issue above is resolved; hidden tests will be run afterwards.
"""


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


def write_task(t: SweTask, out_dir: Path, agent_timeout: float = 1800, verifier_timeout: float = 1800,
               bake_grader: bool = False) -> Path:
    """Write one task dir atomically (built aside, then renamed over any old one)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / t.instance_id
    tmp = Path(tempfile.mkdtemp(prefix=f".{t.instance_id}.", dir=out_dir))
    try:
        (tmp / "environment").mkdir()
        (tmp / "environment" / "Dockerfile").write_text(dockerfile(t, bake_grader))
        (tmp / "task.toml").write_text(task_toml(t, agent_timeout, verifier_timeout, bake_grader))
        (tmp / "instruction.md").write_text(INSTRUCTION.format(
            problem=t.problem_statement.strip(), repo=t.repo, commit=t.base_commit))
        sol = tmp / "solution"
        sol.mkdir()
        (sol / "gold.patch").write_text(t.patch)
        (sol / "solve.sh").write_text(SOLVE_SH.replace("@@IID@@", t.instance_id))
        tests = tmp / "tests"
        tests.mkdir()
        shutil.copyfile(GRADING_PY, tests / "grading.py")
        spec = {"instance_id": t.instance_id, "repo": t.repo, "version": t.version,
                "FAIL_TO_PASS": t.fail_to_pass, "PASS_TO_PASS": t.pass_to_pass,
                "log_parser": t.log_parser, "eval_type": t.eval_type}
        (tests / "spec.json").write_text(json.dumps(spec, indent=2) + "\n")
        if t.eval_script:
            (tests / "eval.sh").write_text(_eval_script_with_exit_code(t.eval_script))
            run = RUN_EVAL_SCRIPT
        else:
            shutil.copyfile(TESTLOG_SH, tests / "testlog.sh")
            (tests / "test.patch").write_text(t.test_patch)
            run = RUN_DERIVED.replace("@@TEST_CMD@@", shlex.quote(t.test_cmd))
        test_sh = (TEST_SH.replace("@@RUN@@", run)
                   .replace("@@IID@@", t.instance_id).replace("@@SOURCE@@", t.source)
                   .replace("@@PIN@@", SWEBENCH_PIN).replace("@@BASE_COMMIT@@", t.base_commit)
                   .replace("@@TEST_FILES@@", " ".join(map(shlex.quote, t.test_files)))
                   .replace("@@TEST_TIMEOUT@@", str(max(60, int(verifier_timeout) - 120))))
        (tests / "test.sh").write_text(test_sh)
        for script in (tests / "test.sh", sol / "solve.sh"):
            script.chmod(0o755)
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


# ---------------------------------------------------------------- CLI

def convert(rows_file: Path, out_dir: Path, limit: int | None = None, ids: list[str] | None = None,
            source: str = "auto", skip_bad: bool = False, agent_timeout: float = 1800,
            verifier_timeout: float = 1800, progress: bool = False,
            bake_grader: bool = False) -> tuple[list[Path], list[str]]:
    """Rows file -> task dirs. Returns (dirs written, errors of skipped rows).

    Raises RowError (every bad row listed) before writing anything, unless skip_bad."""
    rows = read_rows(rows_file)
    selected = []
    for n, row in enumerate(rows, 1):
        if ids and not (isinstance(row, dict) and row.get("instance_id") in ids):
            continue
        selected.append((n, row))
    if ids:
        missing = set(ids) - {r.get("instance_id") for _, r in selected}
        if missing:
            raise RowError(f"{rows_file}: no row with instance_id {', '.join(sorted(missing))}")
    tasks, errors = [], []
    for n, row in selected:
        if limit is not None and len(tasks) >= limit:
            break
        try:
            tasks.append(parse_row(row, f"{rows_file}: row {n}", source))
        except RowError as e:
            errors.append(str(e))
    if errors and not skip_bad:
        raise RowError("\n".join(errors) + f"\n{len(errors)} bad row(s); nothing written (--skip-bad writes the rest)")
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(tasks), unit="task", desc="swegym", file=sys.stderr)
    written = []
    for t in tasks:
        written.append(write_task(t, out_dir, agent_timeout, verifier_timeout, bake_grader))
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    return written, errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m collect.tasks.swegym",
                                 description="SWE-Gym / SWE-bench rows -> harbor task dirs.")
    ap.add_argument("rows_file", type=Path, help=".jsonl, .json or .parquet of rows")
    ap.add_argument("out_dir", type=Path, help="where <instance_id>/ task dirs go")
    ap.add_argument("--limit", type=int, help="convert at most N rows")
    ap.add_argument("--ids", nargs="+", metavar="ID", help="only these instance_ids")
    ap.add_argument("--source", choices=("auto", "swe-gym", "swe-bench"), default="auto",
                    help="image naming and defaults; auto: SWE-bench if the row has eval_script/"
                    "image/environment_setup_commit or JSON-string test lists")
    ap.add_argument("--agent-timeout", type=float, default=1800)
    ap.add_argument("--verifier-timeout", type=float, default=1800)
    ap.add_argument("--skip-bad", action="store_true", help="write the good rows, report the bad")
    ap.add_argument("--bake-grader", action="store_true",
                    help="build environment/Dockerfile with swebench preinstalled instead of using the "
                    "image as is (saves a pip install of swebench in every verification)")
    args = ap.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        ap.error("--limit must be >= 1")
    try:
        written, errors = convert(args.rows_file, args.out_dir, args.limit, args.ids, args.source,
                                  args.skip_bad, args.agent_timeout, args.verifier_timeout,
                                  progress=sys.stderr.isatty() or bool(os.environ.get("WHARF_PROGRESS")),
                                  bake_grader=args.bake_grader)
    except RowError as e:
        print(f"swegym: error: {e}", file=sys.stderr)
        return 2
    for e in errors:
        print(f"swegym: skipped: {e}", file=sys.stderr)
    print(f"swegym: wrote {len(written)} task dir(s) to {args.out_dir}" +
          (f", skipped {len(errors)} bad row(s)" if errors else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
