"""The contest judge's spec of this task (wharf/tasks/tools/judge.py): the grader draws each check's
inputs when it grades, the code under test answers them in its own process, and the answers
are compared here, in the grader, with the reference. The agent never sees this file."""

MODULE = "text"
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 "


def _word(rng):
    return "".join(rng.choice(LETTERS) for _ in range(rng.randrange(0, 12)))


CHECKS = {
    "reverse": {"inputs": lambda rng: [("abc",)] + [(_word(rng),) for _ in range(30)], "reference": lambda s: s[::-1]},
    "shout": {"inputs": lambda rng: [("hi",)] + [(_word(rng),) for _ in range(30)], "reference": lambda s: s.upper() + "!"},
}
