"""One harbor TrialConfig per rollout, and a rollout status read off harbor's TrialResult."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig, VerifierConfig
from harbor.models.trial.result import TrialResult

from wharf.core.config import CollectConfig
from wharf.collect.records import Outcome
from wharf.core.errors import WharfError

# harbor agents that take the endpoint as a constructor option rather than from the environment;
# our own agents (collect.agents.*) take base_url and api_key.
_URL_KWARG = {"terminus-2": "api_base"}
_OWN_AGENTS = "wharf.collect.agents."


@dataclass(frozen=True)
class RolloutRoute:
    """Where one rollout's agent sends its model calls (the proxy's per-rollout route)."""

    base_url: str  # .../rollout/<id>/v1
    api_key: str
    model: str  # the policy name; the proxy maps whatever the agent sends to it


def _is_import_path(ref: str) -> bool:
    return ":" in ref


def agent_config(cc: CollectConfig, ep: RolloutRoute) -> AgentConfig:
    """Point any harbor agent at the rollout's route: every common env convention plus the URL
    option of agents that take one; the user's agent_kwargs/agent_env win."""
    root = ep.base_url[: -len("/v1")] if ep.base_url.endswith("/v1") else ep.base_url
    env = {
        "OPENAI_BASE_URL": ep.base_url,
        "OPENAI_API_BASE": ep.base_url,
        "OPENAI_API_KEY": ep.api_key,
        "MSWEA_API_KEY": ep.api_key,
        "OPENAI_MODEL": ep.model,
        "LLM_BASE_URL": ep.base_url,
        "LLM_API_KEY": ep.api_key,
        "LLM_MODEL": f"openai/{ep.model}",
        # claude-code appends /v1/messages itself
        "ANTHROPIC_BASE_URL": root,
        "ANTHROPIC_API_KEY": ep.api_key,
        # gemini-cli appends /v1beta/models/... itself
        "GOOGLE_GEMINI_BASE_URL": root,
        "GEMINI_API_KEY": ep.api_key,
    }
    kwargs = {}
    if cc.agent in _URL_KWARG:
        kwargs[_URL_KWARG[cc.agent]] = ep.base_url
    if cc.agent == "terminus-2":  # it calls litellm in harbor's own process: no sandbox env, so the key here
        kwargs["llm_kwargs"] = {"api_key": ep.api_key}
    if cc.agent.startswith(_OWN_AGENTS):
        kwargs.update(base_url=ep.base_url, api_key=ep.api_key)
    kwargs.update(cc.agent_kwargs)
    env.update(cc.agent_env)
    ref = {"import_path": cc.agent} if _is_import_path(cc.agent) else {"name": cc.agent}
    # litellm-based agents (and harbor's model-name check) need a provider prefix; the proxy maps
    # whatever model name the agent sends to the policy, so the prefix costs nothing.
    model_name = f"openai/{ep.model}"
    return AgentConfig(
        **ref,
        model_name=model_name,
        kwargs=kwargs,
        env=env,
        override_timeout_sec=cc.agent_timeout_s,
    )


# Our sandbox: it has no network but the addresses it is told to forward.
_BWRAP = "wharf.collect.sandbox.bwrap:BwrapEnvironment"


def environment_config(cc: CollectConfig, ep: RolloutRoute | None = None) -> EnvironmentConfig:
    ref = {"import_path": cc.environment} if _is_import_path(cc.environment) else {"type": cc.environment}
    kwargs = dict(cc.environment_kwargs)
    if ep is not None and cc.environment == _BWRAP:
        kwargs.setdefault("forward", [ep.base_url])  # the rollout's route is its only way out
    return EnvironmentConfig(**ref, kwargs=kwargs)


class TrialSetupError(WharfError, ValueError):
    """An agent or environment that harbor cannot load or that refuses its options: a bad config
    value (collect.agent, collect.environment), exit 2."""

    exit_code = 2


def preflight(cc: CollectConfig) -> None:
    """Load the agent and environment classes and check their options once, before any trial:
    a typo would otherwise fail every trial of the round, one by one."""
    from harbor.agents.factory import AgentFactory
    from harbor.environments.factory import EnvironmentFactory

    probe = RolloutRoute("http://127.0.0.1:1/rollout/preflight/v1", "preflight", "preflight")
    try:
        AgentFactory.run_preflight(agent_config(cc, probe))
    except Exception as e:  # noqa: BLE001 - harbor raises ValueError, ImportError, pydantic errors
        raise TrialSetupError(f"collect.agent={cc.agent!r}: {e}") from None
    try:
        env = environment_config(cc)
        EnvironmentFactory.run_preflight(env.type, env.import_path)
    except Exception as e:  # noqa: BLE001
        raise TrialSetupError(f"collect.environment={cc.environment!r}: {e}") from None


def trial_config(cc: CollectConfig, task_path: Path, trial_name: str, trials_dir: Path, ep: RolloutRoute) -> TrialConfig:
    return TrialConfig(
        task=TaskConfig(path=task_path),
        trial_name=trial_name,
        trials_dir=trials_dir,
        agent=agent_config(cc, ep),
        environment=environment_config(cc, ep),
        verifier=VerifierConfig(override_timeout_sec=cc.verifier_timeout_s),
    )


# harbor exception type names -> our rollout status
_INFRA = {
    "EnvironmentStartTimeoutError", "AgentSetupTimeoutError", "HealthcheckError",
    "SandboxBuildFailedError", "NetworkConnectionError", "ApiConnectionClosedError",
    "ApiInternalServerError", "ApiOverloadedError", "ApiRateLimitError", "CancelledError",
    "SandboxStartError",  # ours (wharf/collect/sandbox/ns.py): the bwrap sandbox's init never answered
}
_VERIFIER = {
    "VerifierTimeoutError", "RewardFileNotFoundError", "RewardFileEmptyError",
    "VerifierOutputParseError", "AddTestsDirError", "DownloadVerifierDirError",
}
_CONTEXT = {"ContextLengthExceededError", "ContextWindowExceededError", "OutputLengthExceededError"}
_CONTEXT_WORDS = ("context length", "context window", "maximum context", "too long")


def primary_reward(rewards: dict) -> float | None:
    """`reward` when the verifier wrote it, else the single key it wrote; None when ambiguous."""
    if "reward" in rewards:
        value = rewards["reward"]
    elif len(rewards) == 1:
        (value,) = rewards.values()
    else:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def classify(result: TrialResult, upstream_errors: int = 0) -> Outcome:
    """Status of a finished trial. `upstream_errors`: calls the proxy could not complete
    (endpoint down or failing) - an agent that died of those is an infrastructure failure."""
    rewards = dict(result.verifier_result.rewards or {}) if result.verifier_result else {}
    reward = primary_reward(rewards) if rewards else None
    exc = result.exception_info
    if exc is None:
        if reward is None:
            return Outcome("verifier_error", None, rewards, f"verifier wrote no usable reward: {json.dumps(rewards)}")
        if upstream_errors and reward <= 0:  # it stopped on a failing endpoint: the 0 is not the policy's
            return Outcome("infra_error", reward, rewards, f"the agent ended unrewarded after {upstream_errors} "
                           "model calls the endpoint failed (a replica refusing the policy, a restart)")
        return Outcome("ok", reward, rewards, None)
    kind, message = exc.exception_type, exc.exception_message
    error = f"{kind}: {message}"[:2000]
    text = message.lower()
    if kind in _CONTEXT or any(w in text for w in _CONTEXT_WORDS):
        status = "context_exceeded"
    elif kind == "AgentTimeoutError" and not upstream_errors:  # else it waited on a failing endpoint
        status = "agent_timeout"
    elif kind in _VERIFIER:
        status = "verifier_error"
    elif kind in _INFRA or upstream_errors > 0:
        status = "infra_error"
    else:
        status = "agent_error"
    return Outcome(status, reward, rewards, error)


def with_judge_reason(outcome: Outcome, trial_dir: Path) -> Outcome:
    """A verifier error led by the grader's own one-line reason, where it left one (the pytest
    judge when the tests never started: rewardproof.JUDGE_ERROR in the trial's verifier dir)."""
    from wharf.collect.sandbox.rewardproof import JUDGE_ERROR

    path = Path(trial_dir) / "verifier" / JUDGE_ERROR
    if outcome.status != "verifier_error" or not path.is_file():
        return outcome
    why = path.read_text(errors="replace").strip()[:1000]
    return dataclasses.replace(outcome, error=f"{why} [{outcome.error or 'no reward'}]"[:2000])
