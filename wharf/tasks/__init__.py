"""What a task is and how it is decided: harbor task dirs and their judges.

    tools/    the graders that run inside the sandbox (stdlib only; shipped there read-only as
              $WHARF_TASK_TOOLS): the contest and checker judges, the hardened pytest judge
    judges.py which judge a task dir names, checked before any trial starts
    swegym/   SWE-Gym / SWE-bench rows -> task dirs

Collect uses this room; it uses nothing of collect's."""
