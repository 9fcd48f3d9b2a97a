"""What a task is and how it is decided: harbor task dirs and their judges.

    tools/    the graders that run inside the sandbox (stdlib only; shipped there read-only as
              $WHARF_TASK_TOOLS): the contest and checker judges, the hardened pytest judge
    judges.py which judge a task dir names, checked before any trial starts
    swegym/   SWE-Gym / SWE-bench rows -> task dirs
    check/    whether a task dir holds: its format, oracle and untouched runs, the hackability audit
    redteam/  the scripted attackers, aimed at any task (tier 2 of the audit; tests/test_redteam.py)

Collect uses this room; it uses nothing of collect's."""
