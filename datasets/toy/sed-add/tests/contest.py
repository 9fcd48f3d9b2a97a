"""The contest judge's spec of this task (wharf/tasks/tools/judge.py): the grader draws each check's
inputs when it grades, the code under test answers them in its own process, and the answers
are compared here, in the grader, with the reference. The agent never sees this file."""

MODULE = "calc"

CHECKS = {
    "add": {"inputs": lambda rng: [(2, 3)] + [(rng.randrange(-100, 100), rng.randrange(-100, 100)) for _ in range(30)],
            "reference": lambda a, b: a + b},
    "neg": {"inputs": lambda rng: [(4,)] + [(rng.randrange(-100, 100),) for _ in range(30)], "reference": lambda a: -a},
}
