"""The collect runner's pure parts: task discovery, planning, trial configs, status classification."""
import datetime as dt

import pytest
from harbor.models.trial.result import ExceptionInfo, TrialResult
from harbor.models.verifier.result import VerifierResult

from wharf.core.config import CollectConfig
from wharf.collect.tasksets import TaskSetError, discover, new_rollout_id, plan, rollout_seed
from wharf.collect.sandbox.ns import SandboxStartError
from wharf.collect.trials import RolloutRoute, TrialSetupError, classify, preflight, primary_reward, trial_config


def make_tasks(root, names):
    for n in names:
        (root / n).mkdir(parents=True)
        (root / n / "task.toml").write_text("version = '1.0'\n")
    return root


def test_discover_plan_and_ids(tmp_path):
    root = make_tasks(tmp_path / "set", ["b", "a"])
    (root / "notes").mkdir()  # not a task: ignored
    tasks = discover(root)
    assert [t.task_id for t in tasks] == ["a", "b"]
    planned = plan(tasks, 3)
    assert [(p.task.task_id, p.attempt) for p in planned][:4] == [("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    ids = {new_rollout_id("f" * 32, p) for p in planned}
    assert len(ids) == 6 and all(i.startswith("ffffffff.") for i in ids)
    # a single task dir is a set of one
    assert [t.task_id for t in discover(root / "a")] == ["a"]


def test_discover_errors_name_the_problem(tmp_path):
    with pytest.raises(TaskSetError, match="not a directory"):
        discover(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskSetError, match="holds no task dir"):
        discover(tmp_path / "empty")
    root = make_tasks(tmp_path / "set", ["a"])
    with pytest.raises(TaskSetError, match=r"\['zzz'\] not found"):
        discover(root, ["zzz"])
    with pytest.raises(TaskSetError, match="attempts must be >= 1"):
        plan(discover(root), 0)


def test_trial_config_points_agent_at_rollout_route(tmp_path):
    ep = RolloutRoute("http://127.0.0.1:8200/rollout/r1/v1", "key-1", "policy-v1")
    cc = CollectConfig(agent="wharf.collect.agents.minimal:MinimalAgent", agent_kwargs={"max_turns": 3})
    tc = trial_config(cc, tmp_path, "r1", tmp_path / "harbor", ep)
    assert tc.agent.import_path == "wharf.collect.agents.minimal:MinimalAgent"
    assert tc.agent.kwargs == {"base_url": ep.base_url, "api_key": "key-1", "max_turns": 3}
    assert tc.agent.env["OPENAI_BASE_URL"] == ep.base_url
    assert tc.agent.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8200/rollout/r1"
    assert tc.environment.import_path == "wharf.collect.sandbox.bwrap:BwrapEnvironment"
    assert tc.trial_name == "r1"

    named = trial_config(CollectConfig(agent="mini-swe-agent", environment="docker"), tmp_path, "r2",
                         tmp_path, ep)
    assert named.agent.name == "mini-swe-agent" and named.agent.model_name == "openai/policy-v1"
    assert named.agent.kwargs == {}
    assert named.environment.type.value == "docker"


def result(rewards=None, exc=None):
    info = None
    if exc:
        info = ExceptionInfo(exception_type=exc[0], exception_message=exc[1], exception_traceback="",
                             occurred_at=dt.datetime.now(dt.timezone.utc))
    return TrialResult.model_construct(
        verifier_result=VerifierResult(rewards=rewards) if rewards is not None else None, exception_info=info)


@pytest.mark.parametrize("res, upstream, status, reward", [
    (result({"reward": 1.0}), 0, "ok", 1.0),
    (result({"accuracy": 0.0}), 0, "ok", 0.0),
    # it ended after the endpoint failed its calls (e.g. 404s from a replica without the policy): no real 0
    (result({"reward": 0.0}), 3, "infra_error", 0.0),
    (result({"reward": 1.0}), 1, "ok", 1.0),  # a retried error that still solved it is the policy's success
    (result({"a": 1, "b": 0}), 0, "verifier_error", None),
    (result(None), 0, "verifier_error", None),
    (result({"reward": 0.0}, ("AgentTimeoutError", "timed out after 5s")), 0, "agent_timeout", 0.0),
    # the agent timed out waiting on an endpoint that failed its calls: not the policy's failure
    (result({"reward": 0.0}, ("AgentTimeoutError", "timed out after 5s")), 2, "infra_error", 0.0),
    (result(None, ("RuntimeError", "model answered 400: maximum context length is 2048")), 3, "context_exceeded", None),
    (result(None, ("RewardFileNotFoundError", "no reward")), 0, "verifier_error", None),
    (result(None, ("EnvironmentStartTimeoutError", "slow")), 0, "infra_error", None),
    (result(None, (SandboxStartError.__name__, "the sandbox did not start")), 0, "infra_error", None),  # as harbor records it
    (result(None, ("RuntimeError", "endpoint said 502")), 2, "infra_error", None),
    (result(None, ("ValueError", "agent bug")), 0, "agent_error", None),
])
def test_classify(res, upstream, status, reward):
    out = classify(res, upstream_errors=upstream)
    assert out.status == status
    assert out.reward == reward
    if status != "ok":
        assert out.error


def test_primary_reward_rejects_non_finite():
    assert primary_reward({"reward": float("nan")}) is None
    assert primary_reward({"reward": "x"}) is None
    assert primary_reward({"reward": 1}) == 1.0


def test_preflight_refuses_unknown_agents_environments_and_options():
    preflight(CollectConfig())  # the embedded default loads
    with pytest.raises(TrialSetupError, match="collect.agent='mini-swe-agnet'"):
        preflight(CollectConfig(agent="mini-swe-agnet"))
    with pytest.raises(TrialSetupError, match="collect.agent='wharf.collect.agents.minimal:NoSuchAgent'"):
        preflight(CollectConfig(agent="wharf.collect.agents.minimal:NoSuchAgent"))
    with pytest.raises(TrialSetupError, match="max_turnz"):
        preflight(CollectConfig(agent_kwargs={"max_turnz": 3}))
    with pytest.raises(TrialSetupError, match="collect.environment='dockr'"):
        preflight(CollectConfig(environment="dockr"))


def test_rollout_seed_depends_on_round_task_and_attempt_only(tmp_path):
    planned = plan(discover(make_tasks(tmp_path / "set", ["a", "b"])), 2)
    seeds = [rollout_seed(0, 0, p) for p in planned]
    assert len(set(seeds)) == 4 and seeds == [rollout_seed(0, 0, p) for p in planned]
    assert seeds != [rollout_seed(0, 1, p) for p in planned] != [rollout_seed(1, 0, p) for p in planned]
    assert rollout_seed(None, 0, planned[0]) is None


def test_a_failed_close_costs_the_rollout_not_the_round():
    import asyncio

    from wharf.collect.proxy_client import ServiceError
    from wharf.collect.node import close_rollout

    class Admin:
        def __init__(self, fail):
            self.fail = fail

        async def close(self, rollout_id):
            if self.fail:
                raise asyncio.TimeoutError()
            raise ServiceError("proxy POST /admin/rollouts/r1/close: HTTP 404: unknown rollout")

    (closed, error) = asyncio.run(close_rollout(Admin(True), "r1"))
    assert closed is None and error.startswith("proxy close failed: TimeoutError")
    (closed, error) = asyncio.run(close_rollout(Admin(False), "r1"))
    assert "HTTP 404" in error
