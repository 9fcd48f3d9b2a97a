"""The orchestration above the three stages: the `wharf` command (cli.py), the RL loop (loop.py),
replay (replay.py), the stage markers both share (stages.py), the run report (report/) and the
agent matrix (agents_check.py). It imports the stages; no stage imports it."""
