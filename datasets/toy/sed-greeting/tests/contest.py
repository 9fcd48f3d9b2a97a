"""The contest judge's spec of this task (wharf/tasks/tools/judge.py): the grader draws each check's
inputs when it grades, the code under test answers them in its own process, and the answers
are compared here, in the grader, with the reference. The agent never sees this file."""

MODULE = "greet"
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _name(rng):
    return "".join(rng.choice(LETTERS) for _ in range(rng.randrange(1, 10)))


CHECKS = {
    "greet": {"inputs": lambda rng: [("Ann",)] + [(_name(rng),) for _ in range(30)],
              "reference": lambda name: "Hello, " + name + "!"},
    "shout": {"inputs": lambda rng: [("ann",)] + [(_name(rng),) for _ in range(30)], "reference": lambda name: name.upper()},
}
