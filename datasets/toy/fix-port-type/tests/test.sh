#!/bin/bash
# The contest judge (wharf/tasks/tools/judge.sh, exported by the bwrap sandbox as $WHARF_TASK_TOOLS):
# inputs drawn at grading time from tests/contest.py, answered by the code under test in its own
# process, compared with the reference in the grader.
exec bash "${WHARF_TASK_TOOLS:-/tests}/judge.sh" contest /app
