"""Turn SWE-Gym / SWE-bench rows into harbor task dirs on the official eval images.

    python -m wharf.tasks.swegym ROWS_FILE OUT_DIR [--limit N] [--ids ID ...]
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
Modules: rows.py reads a rows file, spec.py checks one row and derives the task (image, test
command, parser), taskdir.py writes a task dir from the bash templates in templates/, cli.py
selects rows and writes them all (`convert`, `main`).
"""
from __future__ import annotations

from .cli import convert, main
from .rows import RowError, read_rows
from .spec import REPO_TEST_CMDS, SweTask, parse_row
from .taskdir import GRADING_PY, SWEBENCH_PIN, TESTLOG_SH, write_task

__all__ = ["GRADING_PY", "REPO_TEST_CMDS", "SWEBENCH_PIN", "TESTLOG_SH", "RowError", "SweTask", "convert", "main",
           "parse_row", "read_rows", "write_task"]
