"""CI cannot go quietly green: docs/development.md states how many tests a CI run skips, and
conftest.py fails a CI run whose count differs; with CI set, a missing bwrap fails instead of
skipping."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import CI_SKIPS_PAGE, REPO, stated_ci_skips


def test_the_docs_state_the_ci_skip_count():
    assert stated_ci_skips((REPO / CI_SKIPS_PAGE).read_text()) == 0
    with pytest.raises(ValueError, match="CI skips"):
        stated_ci_skips("no such line")


@pytest.mark.slow
def test_a_ci_run_with_an_unexpected_skip_fails(tmp_path):
    (tmp_path / "test_one.py").write_text("import pytest\n\ndef test_skipped():\n    pytest.skip('a part is missing')\n")
    (tmp_path / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
                                          "from tests.conftest import pytest_sessionfinish, pytest_sessionstart\n")
    env = {**os.environ, "CI": "1"}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and f"1 tests skipped, {CI_SKIPS_PAGE} says 0" in p.stdout, p.stdout[-2000:]
    env.pop("CI")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:]


def test_every_group_has_a_budget_and_every_named_module_exists():
    """The budget table of docs/development.md covers every group tests/suite_budget.py can give
    a test, and the modules it names are test files (a renamed file would fall back to `unit`)."""
    from tests import suite_budget

    budgets = suite_budget.stated_budgets((REPO / "docs/development.md").read_text())
    groups = {*suite_budget.MODULE_GROUPS.values(), *(g for _, g in suite_budget.FIXTURE_GROUPS),
              suite_budget.DEFAULT_GROUP}
    assert groups <= budgets.keys(), groups - budgets.keys()
    missing = [m for m in suite_budget.MODULE_GROUPS if not (REPO / "tests" / f"{m}.py").is_file()]
    assert not missing, missing
    assert suite_budget.stated_budgets("| loop | 900 s | 1 s |\n| `engine` | 12 s |") == {"loop": 900.0, "engine": 12.0}
