#!/bin/bash
# Grade a task the SWE-bench way: put the task's test files in place (overwriting any edit of
# them), run pytest between the log markers with its exit code recorded, remove them again, and
# grade the log against /tests/spec.json (FAIL_TO_PASS / PASS_TO_PASS) into /logs/verifier.
# usage (from a task's tests/test.sh): grade_pytest.sh WORKDIR TEST_FILE...
# WHARF_PYTHON: an interpreter with pytest + swebench (the bwrap sandbox exports the project
# venv's); elsewhere python3 must have them.
PY="${WHARF_PYTHON:-python3}"
TOOLS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORKDIR="$1"; shift
export PYTHONDONTWRITEBYTECODE=1
cd "$WORKDIR" || exit 1
for f in "$@"; do cp "/tests/$f" "$WORKDIR/$f"; done
. "$TOOLS/testlog.sh"
wharf_run_tests /logs/verifier/test_output.log "$PY -m pytest -rA -p no:cacheprovider $*" || true
for f in "$@"; do rm -f "$WORKDIR/$f"; done
"$PY" "$TOOLS/grading.py" --spec /tests/spec.json --log /logs/verifier/test_output.log
