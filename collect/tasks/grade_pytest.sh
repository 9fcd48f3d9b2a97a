#!/bin/bash
# Grade a task the SWE-bench way: put the task's test files in place (overwriting any edit of
# them), run pytest between the log markers with its exit code recorded, remove them again, and
# grade the log against /tests/spec.json (FAIL_TO_PASS / PASS_TO_PASS) into /logs/verifier.
# usage (from a task's tests/test.sh): grade_pytest.sh WORKDIR TEST_FILE...
# WHARF_TESTS_DIR (/tests) and WHARF_VERIFIER_DIR (/logs/verifier): elsewhere, for tests.
# WHARF_PYTHON: an interpreter with pytest + swebench (the bwrap sandbox exports the project
# venv's); elsewhere python3 must have them.
PY="${WHARF_PYTHON:-python3}"
TOOLS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORKDIR="$1"; shift
TESTS="${WHARF_TESTS_DIR:-/tests}"
VERIFIER="${WHARF_VERIFIER_DIR:-/logs/verifier}"
export PYTHONDONTWRITEBYTECODE=1
# Defence in depth where the sandbox has not already set the agent's test config aside (a
# Docker environment): no conftest.py, no ini file (-c /dev/null); python -I: no cwd first on
# sys.path (a planted pytest.py), no PYTHON* variables, no user site dir; no pytest options or
# plugins from the environment.
unset PYTEST_ADDOPTS PYTEST_PLUGINS
cd "$WORKDIR" || exit 1
for f in "$@"; do cp "$TESTS/$f" "$WORKDIR/$f"; done
. "$TOOLS/testlog.sh"
wharf_run_tests "$VERIFIER/test_output.log" \
    "$PY -I -m pytest -rA -p no:cacheprovider --noconftest -c /dev/null --rootdir $WORKDIR $*" || true
for f in "$@"; do rm -f "$WORKDIR/$f"; done
"$PY" "$TOOLS/grading.py" --spec "$TESTS/spec.json" --log "$VERIFIER/test_output.log" --out "$VERIFIER"
