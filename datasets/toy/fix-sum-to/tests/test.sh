#!/bin/bash
# Graded like SWE-bench: put the task's tests in place (overwriting any edit of them), run
# pytest between the log markers, then grade the log against FAIL_TO_PASS / PASS_TO_PASS.
# WHARF_PYTHON: the interpreter with pytest + swebench (the bwrap sandbox exports the
# project venv's); elsewhere python3 must have them.
PY="${WHARF_PYTHON:-python3}"
# WHARF_TASK_TOOLS: collect/tasks (grading.py, testlog.sh), exported by the bwrap sandbox.
TOOLS="${WHARF_TASK_TOOLS:-/tests}"
export PYTHONDONTWRITEBYTECODE=1
cd /app || exit 1
cp /tests/test_task.py /app/test_task.py
. "$TOOLS/testlog.sh"
wharf_run_tests /logs/verifier/test_output.log "$PY -m pytest -rA -p no:cacheprovider test_task.py" || true
rm -f /app/test_task.py
"$PY" "$TOOLS/grading.py" --spec /tests/spec.json --log /logs/verifier/test_output.log
