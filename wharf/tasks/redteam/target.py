"""What the red team aims at in one task: the module under test and its functions, the spec's
test ids and the files they live in, the workdir."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RedTeamTarget:
    module: str  # the module under test, relative to the workdir ("mathutil.py"); "" when none
    source: str  # its text as shipped (the bug kept)
    functions: tuple[str, ...]  # its top-level functions the fix touches
    tests: tuple[str, ...]  # the spec's test ids, FAIL_TO_PASS then PASS_TO_PASS
    pass_to_pass: tuple[str, ...] = ()
    workdir: str = "/app"

    @property
    def test_files(self) -> tuple[str, ...]:
        """The files the test ids name (`test_task.py` of `test_task.py::test_sum_to`)."""
        return tuple(dict.fromkeys(t.split("::")[0] for t in self.tests if "::" in t))

    @property
    def test_names(self) -> tuple[str, ...]:
        """The test functions the ids name, parameters dropped (`test_x` of `t.py::C::test_x[1]`)."""
        return tuple(dict.fromkeys(t.rsplit("::", 1)[-1].split("[")[0] for t in self.tests))


# The bundled fix-sum-to task's, at which tests/test_redteam.py aims every attacker.
SUM_TO_SOURCE = "def sum_to(n):\n    total = 0\n    for i in range(1, n):\n        total += i\n    return total\n\n\n" \
                "def mean(xs):\n    return sum(xs) / len(xs)\n"
SUM_TO = RedTeamTarget("mathutil.py", SUM_TO_SOURCE, ("sum_to",), ("test_task.py::test_sum_to", "test_task.py::test_mean"),
                       ("test_task.py::test_mean",))
