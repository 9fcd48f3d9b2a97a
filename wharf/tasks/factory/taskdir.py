"""A kept bug -> its harbor task dir, judged by wharf's pytest judge (pytest_grade.py).

    task.toml       judge "pytest", the package, the mutation, wharf_expose: the package's env
    instruction.md  what a developer would see: the failing tests' names and crash messages
    environment/    the package's source as shipped, with the bug in it (the workspace, /app)
    tests/          test.sh, spec.json (FAIL_TO_PASS / PASS_TO_PASS), the test files as shipped
    solution/       fix.patch (the reverse of the mutation) and solve.sh, which applies it
Written aside and renamed into place: a half-written dir is never left.
"""
from __future__ import annotations

import difflib
import hashlib
import json
import shlex
import shutil
import tempfile
from pathlib import Path

from . import mutate
from .package import Package

WORKDIR = "/app"


def task_id(pkg: Package, bug: dict) -> str:
    key = f"{bug['file']}:{bug['line']}:{bug['col']}:{bug['operator']}:{bug['replacement']}"  # two shifts can share a place
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return f"{pkg.name.lower().replace('_', '-').replace('.', '-')}-{pkg.version}__{digest}"


def mutation_of(bug: dict) -> mutate.Mutation:
    return mutate.Mutation(**{k: bug[k] for k in mutate.Mutation.__dataclass_fields__})


def fix_patch(path: str, buggy: str, fixed: str) -> str:
    diff = difflib.unified_diff(buggy.splitlines(keepends=True), fixed.splitlines(keepends=True),
                                fromfile=f"a/{path}", tofile=f"b/{path}")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in diff)


def test_files(bug: dict) -> list[str]:
    return sorted({t.split("::")[0] for t in bug["FAIL_TO_PASS"] + bug["PASS_TO_PASS"]})


def test_sh(pkg: Package, files: list[str], test_timeout: int) -> str:
    opts = " ".join(shlex.quote(a) for a in pkg.pytest_args)
    pythonpath = "$WORKDIR" if pkg.pyroot == "." else f"$WORKDIR/{pkg.pyroot}"
    return f"""#!/bin/bash
# Grade {pkg.name}=={pkg.version} with wharf's pytest judge (pytest_grade.py, from the tools dir the
# sandbox exports as $WHARF_TASK_TOOLS): the shipped test files put back in place, the tests run
# in the package's own environment (shown read-only in the sandbox), graded on tests/spec.json;
# only the spec's tests run (--only-spec: their node ids, as the hunt ran them).
TOOLS="${{WHARF_TASK_TOOLS:?set it to wharf/tasks/tools, the pytest judge}}"
TESTS="${{WHARF_TESTS_DIR:-/tests}}"
VERIFIER="${{WHARF_VERIFIER_DIR:-/logs/verifier}}"
WORKDIR="${{WHARF_TESTBED:-{WORKDIR}}}"
PKG_PYTHON={shlex.quote(str(pkg.python))}
unset PYTEST_ADDOPTS PYTEST_PLUGINS
cd "$WORKDIR" || exit 1
files=()
for f in {" ".join(shlex.quote(f) for f in files)}; do
    mkdir -p "$(dirname "$f")" && cp "$TESTS/$f" "$f" && files+=(--test-file "$f")
done
exec "${{WHARF_PYTHON:-python3}}" -I "$TOOLS/pytest_grade.py" --spec "$TESTS/spec.json" --out "$VERIFIER" \\
    --timeout "${{WHARF_TEST_TIMEOUT:-{test_timeout}}}" --python "$PKG_PYTHON" --reward-key "$TESTS/.wharf-reward-key" \\
    --only-spec "${{files[@]}}" -- -p no:cacheprovider -o addopts= -o "pythonpath={pythonpath}" --rootdir "$WORKDIR" -q {opts}
"""


SOLVE_SH = """#!/bin/bash
# The oracle: undo the bug (fix.patch is the reverse of the mutation).
set -euo pipefail
SOLUTION_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "${WHARF_TESTBED:-/app}"
git apply "$SOLUTION_DIR/fix.patch" 2>/dev/null || patch --batch -p1 -i "$SOLUTION_DIR/fix.patch"
"""


def instruction(pkg: Package, bug: dict) -> str:
    where = f"its source under `{pkg.pyroot}/`" if pkg.pyroot != "." else "its source at the top"
    lines = [f"The Python package `{pkg.name}` (version {pkg.version}) is checked out at {WORKDIR}, {where}, "
             f"with its test suite as shipped. "
             f"A change broke it: {len(bug['FAIL_TO_PASS'])} of its tests that used to pass now fail.", ""]
    for t in bug["FAIL_TO_PASS"][:3]:
        msg = bug["messages"].get(t, "").strip() or "(failed)"
        lines += [f"- `{t}` fails with:", "", "  ```", *("  " + m for m in msg.splitlines()[:12]), "  ```", ""]
    if len(bug["FAIL_TO_PASS"]) > 3:
        lines += [f"- and {len(bug['FAIL_TO_PASS']) - 3} more.", ""]
    pp = "$PWD" if pkg.pyroot == "." else f"$PWD/{pkg.pyroot}"
    lines += ["Find the bug in the package's source and fix it there; do not change the tests. The package's "
              "test environment is ready; from the checkout, run a test with:", "",
              f"    {pkg.python} -m pytest -p no:cacheprovider -o addopts= -o pythonpath={pp} "
              f"{' '.join(pkg.pytest_args)} {shlex.quote(bug['FAIL_TO_PASS'][0])}".replace("  ", " "), ""]
    return "\n".join(lines)


def task_toml(pkg: Package, bug: dict, test_timeout: int) -> str:
    meta = {"judge": "pytest", "category": "real-bugfix", "package": pkg.name, "version": pkg.version,
            "file": bug["file"], "function": bug["function"], "line": bug["line"], "operator": bug["operator"],
            "n_fail_to_pass": len(bug["FAIL_TO_PASS"]), "n_pass_to_pass": len(bug["PASS_TO_PASS"])}
    out = ["[metadata]"] + [f"{k} = {json.dumps(v)}" for k, v in meta.items()]
    out += [f"wharf_expose = {json.dumps([str(pkg.env)])}", 'tags = ["real", "python", "mutation"]',
            "", "[agent]", "timeout_sec = 1200.0", "", "[verifier]", f"timeout_sec = {float(test_timeout * 3 + 60)}",
            "", "[environment]", f'workdir = "{WORKDIR}"', ""]
    return "\n".join(out)


def write(pkg: Package, bug: dict, out_dir: Path, test_timeout: int) -> Path:
    """The task dir of `bug` under out_dir (replacing none: an existing one is left as it is)."""
    final = out_dir / task_id(pkg, bug)
    if final.exists():
        return final
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=out_dir))
    try:
        _fill(pkg, bug, tmp, test_timeout, final.name)
        tmp.chmod(0o755)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _fill(pkg: Package, bug: dict, tmp: Path, test_timeout: int, tid: str) -> None:
    env = tmp / "environment"
    shutil.copytree(pkg.root, env, symlinks=False)
    (env / "Dockerfile").unlink(missing_ok=True)  # an sdist's own (croniter's): harbor would build it as the task's image
    original = (pkg.root / bug["file"]).read_text(encoding="utf-8")
    buggy = mutate.apply(original, mutation_of(bug))
    (env / bug["file"]).write_text(buggy, encoding="utf-8")
    tests = tmp / "tests"
    files = test_files(bug)
    for f in files:
        (tests / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pkg.root / f, tests / f)
    spec = {"instance_id": tid, "repo": pkg.name, "version": pkg.version,
            "FAIL_TO_PASS": bug["FAIL_TO_PASS"], "PASS_TO_PASS": bug["PASS_TO_PASS"],
            "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"}
    (tests / "spec.json").write_text(json.dumps(spec, indent=2) + "\n")
    (tests / "test.sh").write_text(test_sh(pkg, files, test_timeout))
    (tests / "test.sh").chmod(0o755)
    sol = tmp / "solution"
    sol.mkdir()
    (sol / "fix.patch").write_text(fix_patch(bug["file"], buggy, original))
    (sol / "solve.sh").write_text(SOLVE_SH)
    (sol / "solve.sh").chmod(0o755)
    (tmp / "instruction.md").write_text(instruction(pkg, bug))
    (tmp / "task.toml").write_text(task_toml(pkg, bug, test_timeout))
