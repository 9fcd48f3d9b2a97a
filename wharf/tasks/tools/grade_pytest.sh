#!/bin/bash
# Grade a pytest task from pytest's own reports (pytest_grade.py): run pytest with wharf's report
# plugin in a fresh copy of WORKDIR with the task's pristine test files put in (read-only to the
# code under test; WORKDIR itself is left as the agent left it), the output kept between the
# SWE-bench markers in test_output.log for people, and grade the verified records against
# /tests/spec.json (FAIL_TO_PASS / PASS_TO_PASS) into reward.json in /logs/verifier; when
# resolved, the same tests run again in another fresh copy and a fresh process and must pass
# there too. Printed output never decides the reward.
# usage (from a task's tests/test.sh): grade_pytest.sh WORKDIR TEST_FILE...
# WHARF_TESTS_DIR (/tests) and WHARF_VERIFIER_DIR (/logs/verifier): elsewhere, for tests.
# WHARF_PYTHON: an interpreter with pytest + swebench (the bwrap sandbox exports the project
# venv's); elsewhere python3 must have them.
# WHARF_TEST_TIMEOUT: seconds the tests may run, then they are killed and graded 0 (default 60;
# keep it below the task's [verifier] timeout_sec so a hang yields a reward, not an error).
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
files=()
for f in "$@"; do files+=(--test-file "$f"); done
exec "$PY" -I "$TOOLS/pytest_grade.py" --spec "$TESTS/spec.json" --out "$VERIFIER" \
    --timeout "${WHARF_TEST_TIMEOUT:-60}" --reward-key "$TESTS/.wharf-reward-key" \
    --workdir "$WORKDIR" --tests-dir "$TESTS" "${files[@]}" -- -rA --noconftest -c /dev/null
