"""The contest judge's spec of this task (wharf/tasks/tools/judge.py): the grader draws each check's
inputs when it grades, the code under test answers them in its own process, and the answers
are compared here, in the grader, with the reference. The agent never sees this file."""

MODULE = "parity"

CHECKS = {
    # the test asked only for truth: is_even(4) and not is_even(7)
    "is_even": {"inputs": lambda rng: [(4,), (7,)] + [(rng.randrange(-1000, 1000),) for _ in range(30)],
                "reference": lambda n: n % 2 == 0, "same": lambda got, want: bool(got) == want},
    "double": {"inputs": lambda rng: [(5,)] + [(rng.randrange(-1000, 1000),) for _ in range(30)],
               "reference": lambda n: 2 * n},
}
