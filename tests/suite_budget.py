"""The suite's time budget: every test belongs to a group named for what it starts (an engine, a
sandboxed round, a loop, Ray, S3, an agent CLI ...), and the end of every run prints the seconds
each group took (setup + call + teardown, summed over its tests) beside the budget
docs/development.md gives it. A group over its budget is named in red; it does not fail the run
(CPU times on a shared 2-core machine move by +-30%), CI's own wall time is the hard limit.

A test's group is its module's in MODULE_GROUPS, else the first live fixture it uses, else `unit`. Adding a live test means giving it a group here and
saying in docs/development.md where its time came from."""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

BUDGET_PAGE = Path(__file__).resolve().parents[1] / "docs/development.md"
# What each module starts; the budget of each group is in docs/development.md.
_GROUPS = {
    "default round": ["test_default_round"],
    "demo rounds": ["test_package", "test_api"],
    "loop": ["test_loop", "test_fleet_live", "test_overlap_live", "test_s3_loop",
             "test_s3_lease"],
    "sandboxed trials": ["test_redteam", "test_collect_round", "test_toy_tasks", "test_minimal_agent", "test_judges",
                         "test_pytest_grade", "test_grading", "test_swegym", "test_learn_tasks", "test_multiturn_tasks",
                         "test_heldout_splits", "test_sandbox_bwrap", "test_sandbox_changes", "test_tasks_check"],
    "agent CLIs": ["test_agent_rounds", "test_agent_clis", "test_agents_check_install"],
    "real tasks": ["test_real_round", "test_tasks_factory", "test_tasks_factory_manifests"],
    "engine": ["test_collect_engine", "test_minimal_agent_engine", "test_engine_adapters", "test_engine_api",
               "test_engine_auth", "test_engine_chat", "test_engine_lora", "test_engine_smoke", "test_endpoint",
               "test_publish_replicas", "test_proxy_engine", "test_eval", "test_warmstart_live",
               "test_model_families", "test_model_identity", "test_engine_tool_calls"],
    "training": ["test_train_loss", "test_train_publish", "test_train_resume", "test_train_stage", "test_warmstart_loop"],
    "ray": ["test_collect_ray", "test_collect_ray_dispatch", "test_collect_ray_nodes"],
    "s3": ["test_s3_round", "test_s3_shards", "test_storage", "test_s3_edges"],
    "trackers": ["test_tracking"],
}
MODULE_GROUPS = {module: group for group, modules in _GROUPS.items() for module in modules}
# Fixtures that start a live part, in the order that decides a test's group.
FIXTURE_GROUPS = (("s3_server", "s3"), ("engine_url", "engine"), ("stub", "stub upstream"))
DEFAULT_GROUP = "unit"


def group_of(item) -> str:
    name = getattr(getattr(item, "module", None), "__name__", "").rpartition(".")[2]
    if name in MODULE_GROUPS:
        return MODULE_GROUPS[name]
    names = set(getattr(item, "fixturenames", ()))
    return next((g for fixture, g in FIXTURE_GROUPS if fixture in names), DEFAULT_GROUP)


def stated_budgets(text: str) -> dict[str, float]:
    """`| group | N s |` rows of docs/development.md's budget table: group -> seconds."""
    return {m.group(1).strip(): float(m.group(2))
            for m in re.finditer(r"^\| `?([^|`]+?)`? \| (\d+) s \|", text, re.MULTILINE)}


def _budget_page() -> dict[str, float]:
    try:
        return stated_budgets(BUDGET_PAGE.read_text())
    except OSError:
        return {}


def pytest_collection_modifyitems(items):
    budgets = _budget_page()
    groups = {item: group_of(item) for item in items}
    for item, group in groups.items():
        # user_properties travel with the reports from xdist workers to the controller.
        item.user_properties.append(("suite_group", group))
    # The heaviest first (slow, then by their group's budget): workers that take files in this
    # order finish together instead of one starting the longest file last.
    items.sort(key=lambda it: (it.get_closest_marker("slow") is None, -budgets.get(groups[it], 0.0)))


def _group(report) -> str:
    return dict(report.user_properties).get("suite_group", DEFAULT_GROUP)


def pytest_terminal_summary(terminalreporter):
    seconds: dict[str, float] = defaultdict(float)
    tests: dict[str, set] = defaultdict(set)
    for reports in terminalreporter.stats.values():
        for r in reports:
            if getattr(r, "when", None) in ("setup", "call", "teardown") and hasattr(r, "user_properties"):
                seconds[_group(r)] += r.duration
                tests[_group(r)].add(r.nodeid)
    if not seconds:
        return
    budgets = _budget_page()
    tr = terminalreporter
    tr.write_sep("=", "time per group (test seconds; with -n, workers overlap them)")
    for g in sorted(seconds, key=seconds.get, reverse=True):
        budget = budgets.get(g)
        over = budget is not None and seconds[g] > budget
        line = f"{g:<28} {seconds[g]:8.1f} s  {len(tests[g]):4d} tests"
        line += f"  budget {budget:.0f} s" if budget is not None else "  (no budget stated)"
        tr.write_line(line + ("  OVER BUDGET" if over else ""), red=over)
    tr.write_line(f"{'total':<28} {sum(seconds.values()):8.1f} s  {sum(map(len, tests.values())):4d} tests")
