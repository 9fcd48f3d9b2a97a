"""The red team: scripted attackers, each one way to forge a reward or leave the sandbox, as the
shell steps an agent driving a terminal would run (str.format templates over the facts an
attacker might know: host_pid, host_file, the proxy's ports, ...). None fixes the task: a reward
above 0 means the attack worked. Aimed at one task through a RedTeamTarget: its module under test
(the grading attackers ride in it, the bug kept), its functions, its spec's tests.

    sandbox.py  the sandbox's own: planted rewards and configs, edited or read tests, the host
    grading.py  forged output and report files, pytest patched, the grader killed, a hang
    plugin.py   the pytest judge's report plugin driven four ways
    fight.py    the grader fought: a forger outliving it, its hook hijacked or interrupted
    answers.py  the comparison: an always-equal answer, a stolen reference
    routes.py   the pytest judge's own routes: xfail, a package __init__, its rewrite cache, ...

`wharf tasks check --redteam` runs them on any task (wharf/tasks/check); tests/test_redteam.py on
the bundled fix-sum-to under each judge, with a live proxy for the proxy's attackers."""
from __future__ import annotations

from pathlib import Path

from wharf.tasks.redteam.answers import answer_tails
from wharf.tasks.redteam.fight import fight_payloads, fight_tails
from wharf.tasks.redteam.grading import grading_payloads
from wharf.tasks.redteam.plugin import plugin_payloads
from wharf.tasks.redteam.routes import route_attacks, write_files
from wharf.tasks.redteam.sandbox import PASS_ALL_CONFTEST, PROXY_ATTACKS, sandbox_attacks
from wharf.tasks.redteam.target import SUM_TO, RedTeamTarget

__all__ = ["PASS_ALL_CONFTEST", "PROXY_ATTACKS", "SUM_TO", "RedTeamTarget", "answer_tails", "attacks", "attacks_for",
           "fight_payloads", "grading_payloads", "payloads", "plugin_payloads", "route_attacks", "sandbox_attacks"]


def payloads(t: RedTeamTarget) -> dict[str, str]:
    """{attacker: code put at the top of the module under test}: grading, plugin and fight."""
    return {**grading_payloads(t), **plugin_payloads(t), **fight_payloads(t)}


def write_module(t: RedTeamTarget, payload: str, tail: str = "") -> str:
    """A shell step writing payload + the module as shipped + tail over the module (braces doubled:
    steps go through str.format)."""
    text = (payload + "\n" + t.source + tail).replace("{", "{{").replace("}", "}}")
    return f"cat > {t.workdir}/{t.module} <<'WHARF_EOF'\n{text}WHARF_EOF"


def attacks(t: RedTeamTarget) -> dict[str, list[str]]:
    """{attacker: shell steps}: the sandbox's, and, with a module under test, those riding in it."""
    out = sandbox_attacks(t)
    if t.module:
        tails = fight_tails(t)
        out.update({name: [write_module(t, p, tails.get(name, ""))] for name, p in payloads(t).items()})
        out.update({name: [write_module(t, "", tail)] for name, tail in answer_tails(t).items()})
        out.update({name: write_files(t, files) for name, files in route_attacks(t).items()})
    return out


def target_of(task, found) -> RedTeamTarget:
    """The red team's target in a checked task (wharf.tasks.check's TaskFormat and the oracle's
    Targets): the first Python module whose functions the fix touches."""
    env = Path(task.path) / "environment"
    module = next((f for f in found if f.path.endswith(".py") and f.functions), None) or \
        next((f for f in found if f.path.endswith(".py") and not f.created), None)
    tests = tuple(task.fail_to_pass) + tuple(task.pass_to_pass)
    if module is None:
        return RedTeamTarget("", "", (), tests, tuple(task.pass_to_pass), task.workdir)
    funcs = tuple(dict.fromkeys(f.qualname for f in module.functions if "." not in f.qualname))
    return RedTeamTarget(module.path, (env / module.path).read_text(), funcs, tests, tuple(task.pass_to_pass),
                         task.workdir)


def attacks_for(task, found) -> dict[str, list[str]]:
    """Tier 2 of `wharf tasks check`: every attacker that needs no proxy, aimed at `task`."""
    return {k: v for k, v in attacks(target_of(task, found)).items() if k not in PROXY_ATTACKS}
