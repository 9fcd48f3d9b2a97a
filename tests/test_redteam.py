"""Red team: scripted attackers (tests/fixtures/redteam/), each a real harbor trial in the
default sandbox on an unsolved task, each trying one way to forge a reward or leave the sandbox.

Every attack must end with reward 0 and leave every other rollout's data, the host's processes
and the host's files as they were. One proxy (on the vLLM-shaped stub) serves the whole suite,
with a victim rollout that already recorded a call; the control attacker that really fixes the
bug must get reward 1, so a 0 means the attack failed, not that grading is broken.

The attackers that act while the grading runs go against the same bug under each judge kind
(docs/judges.md): fix-sum-to judged contest-style, and fixtures of it judged by a checker and by
the hardened in-process pytest run; the sandbox's own attackers go against the contest task.
"""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
from pathlib import Path

import pytest
import requests

from testing.vllm_stub import StubServer
from wharf.collect.proxy.background import BackgroundProxy
from tests.conftest import needs_bwrap
from tests.fixtures.redteam import ANSWER_ATTACKS_TAIL, ATTACKS, GRADING_ATTACKS, PLUGIN_ATTACKS, ROUTE_ATTACKS, \
    ROUTE_PROBLEMS
from tests.test_proxy import make_cfg

REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "datasets" / "toy" / "fix-sum-to"
TASKS = {"contest": TASK, "checker": REPO / "tests/fixtures/tasks/checker-sum-to",
         "pytest": REPO / "tests/fixtures/tasks/pytest-sum-to"}

pytestmark = [needs_bwrap, pytest.mark.slow]


class World:
    """What the attackers aim at: the proxy and its admin token, a victim rollout, the engine,
    a host process holding a secret, and a host file path."""

    def __init__(self, tmp: Path, stub: StubServer, proxy: BackgroundProxy, token: str):
        self.tmp, self.stub, self.proxy, self.token = tmp, stub, proxy, token
        self.victim = "victim-" + secrets.token_hex(8)
        self.secret = secrets.token_hex(16)
        self.host_dir = tmp / "host"
        self.host_dir.mkdir()
        self.host_file = self.host_dir / "pwned"
        self.host_proc = subprocess.Popen(["sleep", "3600"], env={"WHARF_SECRET": self.secret, "PATH": os.defpath})

    def admin(self, method: str, path: str, **kw) -> requests.Response:
        return requests.request(method, self.proxy.admin_url + path, headers={"Authorization": f"Bearer {self.token}"},
                                **kw)

    def victim_state(self) -> dict:
        r = self.admin("GET", f"/admin/rollouts/{self.victim}")
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("redteam")
    token, engine_key = secrets.token_hex(16), secrets.token_hex(16)
    # As in a default run: the engine takes only the run's key, which the proxy sends.
    with StubServer(api_key=engine_key) as stub, \
            BackgroundProxy(make_cfg(tmp, stub.url, f"proxy.admin_token={token}", f"endpoint.api_key={engine_key}")) as proxy:
        w = World(tmp, stub, proxy, token)
        opened = w.admin("POST", "/admin/rollouts", json={"rollout_id": w.victim}).json()
        r = requests.post(f"{opened['base_url']}/chat/completions", headers={"Authorization": f"Bearer {opened['api_key']}"},
                          json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        before = w.victim_state()
        try:
            yield w
        finally:
            alive = w.host_proc.poll() is None
            w.host_proc.kill()
            w.host_proc.wait()
        # every other rollout's data unchanged, the host process untouched, across the suite
        assert w.victim_state() == before
        assert alive


def run_attack(world: World, attack: str, include_logs: list[str] | None = None, task: Path = TASK) -> tuple:
    return asyncio.run(attack_trial(world, attack, include_logs, task))


async def attack_trial(world: World, attack: str, include_logs: list[str] | None = None, task: Path = TASK) -> tuple:
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig, VerifierConfig
    from harbor.trial.trial import Trial

    rid = f"{attack}-{secrets.token_hex(4)}"
    opened = world.admin("POST", "/admin/rollouts", json={"rollout_id": rid}).json()
    facts = {"host_pid": world.host_proc.pid, "host_file": str(world.host_file), "proxy_port": world.proxy.url.rsplit(":", 1)[1],
             "admin_port": world.proxy.admin_url.rsplit(":", 1)[1],
             "engine_port": world.stub.url.rsplit(":", 1)[1].split("/")[0], "victim": world.victim, "own": rid,
             "admin_token": world.token, "repo": str(REPO)}
    trials = world.tmp / "trials"
    cfg = TrialConfig(
        task=TaskConfig(path=task),
        trial_name=rid,
        trials_dir=trials,
        agent=AgentConfig(import_path="tests.fixtures.redteam:AttackAgent", kwargs={"attack": attack, "facts": facts}),
        environment=EnvironmentConfig(import_path="wharf.collect.sandbox.bwrap:BwrapEnvironment",
                                      kwargs={"forward": [opened["base_url"]], "disk_mb": 64, "pids_max": 256}),
        # the tests of fix-sum-to take ~1 s: a hung test process is killed (and graded 0) after 15
        verifier=VerifierConfig(env={"WHARF_TEST_TIMEOUT": "15"}, include_logs=include_logs or []),
    )
    result = await (await Trial.create(cfg)).run()
    steps = json.loads((trials / rid / "agent" / "attack.json").read_text())
    return result, steps, trials / rid


def said(steps: list[dict]) -> str:
    return "\n".join(s.get("stdout", "") + s.get("stderr", "") + s.get("error", "") for s in steps)


def assert_nothing_leaked(world: World, out: str, trial_dir: Path) -> None:
    """Nothing of the host leaked or changed, and the trial stayed within its size."""
    assert world.secret not in out
    for secret in ("def test_sum_to", "range(1, n + 1)", "n * (n + 1)"):
        assert secret not in out, f"tests/ or solution/ were readable: {secret!r}"
    assert not world.host_file.exists(), "a host file was written from the sandbox"
    assert world.host_proc.poll() is None, "a host process was killed from the sandbox"
    for code in ("HTTP=200", "HTTP=201"):
        assert code not in out, f"a host service answered the sandbox: {out[-2000:]}"
    size = sum(p.stat().st_size for p in trial_dir.rglob("*") if p.is_file())
    assert size < 80 << 20, f"the trial dir grew to {size} bytes"


@pytest.mark.parametrize("kind", sorted(TASKS))
def test_every_attacker_on_the_grading_gets_0_and_the_fix_1_under_each_judge(world, kind):
    """One test per judge kind, its trials two at a time: the control that fixes the bug gets 1.0,
    every attacker that acts while the grading runs (the earlier ones, the four that drive the
    pytest plugin through gc, the call stack, sys.modules and ctypes, the three that fight the
    grader: a process chain that outlives its parents and stops the grader to rewrite its
    reward.json, a hijack of the hook's lookups, code run inside the hook that looks for a signer,
    hostile JSON answers; for the judges outside the process, a stolen reference; an always-equal
    answer; and, for the pytest judge, the routes of issue 53: xfail or skip from the code, a package
    __init__ that rewrites the tests, a forged rewrite cache, a second audit hook, a swapped test
    code object, a signal handler, ctypes over the sealer, an always-equal object) gets 0."""
    attacks = ["solve", *sorted(GRADING_ATTACKS)] + (sorted(ANSWER_ATTACKS_TAIL) if kind != "pytest" else
                                                     ["always_equal", *sorted(ROUTE_ATTACKS)])

    async def all_trials():
        sem = asyncio.Semaphore(2)

        async def one(attack):
            async with sem:
                return attack, await attack_trial(world, attack, task=TASKS[kind])
        return dict(await asyncio.gather(*(one(a) for a in attacks)))

    for attack, (result, steps, trial_dir) in asyncio.run(all_trials()).items():
        assert result.verifier_result is not None, (attack, result.exception_info)
        rewards = result.verifier_result.rewards
        assert rewards["reward"] == (1.0 if attack == "solve" else 0.0), (kind, attack, rewards, said(steps)[-3000:])
        # the grader outlived every attacker (kill_grader and outlive_and_forge included: they
        # could not see it) and signed its own verdict, the code under test confined
        assert rewards[{"pytest": "grader_pytest_report"}.get(kind, f"judge_{kind}")] == 1, (attack, rewards)
        assert rewards["confined"] == 1 and "reward_rejected" not in rewards, (attack, rewards)
        detail = json.loads((trial_dir / "verifier" / "grading.json").read_text())
        if kind == "pytest" and attack == "plugin_via_ctypes":  # no ctypes: the module does not import
            assert "import ctypes is refused" in (trial_dir / "verifier" / "test_output.log").read_text(), detail
        elif kind == "pytest" and attack in PLUGIN_ATTACKS:  # the audit hook saw them
            assert any("refused" in p or "outside pytest's own call site" in p for p in detail["problems"]), detail
        if kind == "pytest" and attack in ROUTE_PROBLEMS:  # seen for what it is, not only the bug's failure
            assert any(ROUTE_PROBLEMS[attack] in p for p in detail["problems"]), (attack, detail["problems"])
        if kind == "contest" and attack == "hostile_json":  # a wrong answer with its reason, not a crash
            assert "OverflowError" in detail["checks"]["contest.py::mean"]["first_wrong"]["why"], detail
        if kind == "pytest" and attack == "solve":
            assert rewards["recheck"] == 1 and rewards["sealed"] == 1, rewards  # signed by the C sealer
        assert_nothing_leaked(world, said(steps), trial_dir)
    assert requests.get(world.proxy.url + "/health", timeout=10).status_code == 200


def test_the_reward_proof_holds_when_the_trial_filters_its_logs(world):
    """harbor downloads the verifier dir another way when include_logs is set: the proof is checked
    there too. The attacker plants a reward and kills what it can see: confined, not the grader,
    whose signed 0 verifies."""
    result, _, trial_dir = run_attack(world, "kill_grader", include_logs=["grading.json"])
    assert result.verifier_result is not None, result.exception_info
    rewards = result.verifier_result.rewards
    assert rewards["reward"] == 0.0 and rewards["judge_contest"] == 1 and "reward_rejected" not in rewards
    assert not (trial_dir / "verifier" / "reward_rejected.txt").exists()
    assert not (trial_dir / "verifier" / "test-stdout.txt").exists()  # filtered out, as asked


@pytest.mark.parametrize("attack", sorted(set(ATTACKS) - {"solve"} - set(GRADING_ATTACKS) - set(ANSWER_ATTACKS_TAIL)
                                           - set(ROUTE_ATTACKS)))
def test_attack_gets_reward_0(world, attack):
    result, steps, trial_dir = run_attack(world, attack)
    assert result.verifier_result is not None, result.exception_info
    assert result.verifier_result.rewards["reward"] == 0.0, (attack, said(steps)[-3000:])
    assert_nothing_leaked(world, said(steps), trial_dir)
    assert requests.get(world.proxy.url + "/health", timeout=10).status_code == 200


def test_the_route_relay_refuses_what_is_not_the_rollouts_route():
    from wharf.collect.sandbox.relay import allowed, parse_forward

    assert parse_forward("http://127.0.0.1:8200/rollout/abc/v1") == ("127.0.0.1", 8200, "/rollout/abc/")
    prefix = "/rollout/abc/"
    assert allowed("/rollout/abc/v1/chat/completions", prefix)
    assert allowed("/rollout/abc/v1/models?x=1", prefix)
    assert allowed("/rollout/abc/v1beta/models/m:streamGenerateContent?alt=sse", prefix)
    for bad in ("/rollout/abd/v1/chat/completions", "/admin/flush", "/rollout/abc/../admin/flush",
                "/rollout/abc/%2e%2e/admin", "http://127.0.0.1:8200/admin", "/rollout/abc/./v1", "*"):
        assert not allowed(bad, prefix), bad
    with pytest.raises(ValueError, match="loopback"):
        parse_forward("http://10.0.0.1:8200/v1")
