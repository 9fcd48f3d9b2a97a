"""The contest judge's spec of this task (wharf/tasks/tools/judge.py): the grader draws each check's
inputs when it grades, the code under test answers them in its own process, and the answers
are compared here, in the grader, with the reference. The agent never sees this file."""

MODULE = "stats"


def _ints(rng):
    return [rng.randrange(-100, 100) for _ in range(rng.randrange(1, 9))]


CHECKS = {
    "largest": {"inputs": lambda rng: [([3, 9, 1],)] + [(_ints(rng),) for _ in range(30)], "reference": max},
    "total": {"inputs": lambda rng: [([1, 2, 3],)] + [(_ints(rng),) for _ in range(30)], "reference": sum},
}
