#!/bin/bash
# The checker judge (wharf/tasks/tools/judge.sh, exported by the bwrap sandbox as $WHARF_TASK_TOOLS):
# tests/check.py reads the state the agent left, from outside it; no code of the workspace runs.
exec bash "${WHARF_TASK_TOOLS:-/tests}/judge.sh" checker /app
