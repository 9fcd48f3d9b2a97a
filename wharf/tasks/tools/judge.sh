#!/bin/bash
# Grade a checker or contest task from outside the code under test (judge.py): the checks run in
# the grader, the code under test only ever in a separate interpreter that gets inputs and sends
# back plain answers. usage (from a task's tests/test.sh): judge.sh checker|contest WORKDIR
# WHARF_TESTS_DIR (/tests) and WHARF_VERIFIER_DIR (/logs/verifier): elsewhere, for tests; the
# spec files are removed once read only from the sandbox's /tests (a copy).
# WHARF_PYTHON: the interpreter for the grader (stdlib only) and the code under test.
# WHARF_TEST_TIMEOUT: seconds one batch of calls may take (default 20).
PY="${WHARF_PYTHON:-python3}"
TOOLS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KIND="$1"
WORKDIR="$(cd "$2" && pwd)" || exit 1
TESTS="${WHARF_TESTS_DIR:-/tests}"
hide=()
[[ -z "${WHARF_TESTS_DIR:-}" ]] && hide=(--hide-spec)
cd / || exit 1  # the workspace is never the grader's cwd
exec "$PY" -I -S "$TOOLS/judge.py" "$KIND" --tests "$TESTS" --workdir "$WORKDIR" --out "${WHARF_VERIFIER_DIR:-/logs/verifier}" \
    --timeout "${WHARF_TEST_TIMEOUT:-20}" --reward-key "$TESTS/.wharf-reward-key" "${hide[@]}"
