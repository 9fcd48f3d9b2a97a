#!/bin/bash
# SWE-bench-style grading of test_task.py: collect/tasks/grade_pytest.sh, which the bwrap
# sandbox exports as $WHARF_TASK_TOOLS.
exec bash "${WHARF_TASK_TOOLS:-/tests}/grade_pytest.sh" /app test_task.py
