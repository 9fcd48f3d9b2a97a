"""The contest judge's spec of this task (wharf/tasks/tools/judge.py): the grader draws each check's
inputs when it grades, the code under test answers them in its own process, and the answers
are compared here, in the grader, with the reference. The agent never sees this file."""

MODULE = "mathutil"


def _ints(rng):
    return [rng.randrange(-50, 50) for _ in range(rng.randrange(1, 9))]


CHECKS = {
    "sum_to": {"inputs": lambda rng: [(3,), (1,)] + [(rng.randrange(0, 1000),) for _ in range(30)],
               "reference": lambda n: n * (n + 1) // 2},
    "mean": {"inputs": lambda rng: [([1, 2, 3],)] + [(_ints(rng),) for _ in range(30)],
             "reference": lambda xs: sum(xs) / len(xs)},
}
