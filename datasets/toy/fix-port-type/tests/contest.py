"""The contest judge's spec of this task (wharf/tasks/tools/judge.py): the grader draws each check's
inputs when it grades, the code under test answers them in its own process, and the answers
are compared here, in the grader, with the reference. The agent never sees this file."""

MODULE = "app.settings"

CHECKS = {
    "port": {"inputs": lambda rng: [()], "reference": lambda: 8080},
    "host": {"inputs": lambda rng: [()], "reference": lambda: "127.0.0.1"},
}
