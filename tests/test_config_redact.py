"""No secret goes into a run dir: a recorded config has its keys, tokens and agent credentials
taken out (wharf/core/config_redact.py), and a child process reads its whole config from a
private file outside the run dir (procs.stage_argv)."""
from __future__ import annotations

import os
import stat

import yaml

from wharf.core import procs
from wharf.core.config import dump_config, load_config
from wharf.core.config_redact import REDACTED, redacted, secret_values

SECRETS = ["endpoint.api_key=ep-secret-1", "engine.api_key=engine-secret-2", "proxy.admin_token=admin-secret-3",
           "collect.agent_env={ANTHROPIC_API_KEY: agent-secret-4, LANG: C}",
           "collect.agent_kwargs={max_turns: 3, llm_kwargs: {api_key: agent-secret-5, temperature: 0.5}}"]
VALUES = ["ep-secret-1", "engine-secret-2", "admin-secret-3", "agent-secret-4", "agent-secret-5"]


def test_a_recorded_config_holds_no_secret_and_loads_again(tmp_path):
    cfg = load_config(None, SECRETS)
    assert sorted(secret_values(cfg)) == sorted(VALUES + ["C"])  # an agent's env is redacted whole
    dump_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert not [v for v in VALUES if v in text], text
    data = yaml.safe_load(text)
    assert data["endpoint"]["api_key"] is None and data["proxy"]["admin_token"] is None
    assert data["collect"]["agent_env"] == {"ANTHROPIC_API_KEY": REDACTED, "LANG": REDACTED}
    assert data["collect"]["agent_kwargs"] == {"max_turns": 3, "llm_kwargs": {"api_key": REDACTED, "temperature": 0.5}}
    assert load_config(tmp_path / "config.yaml").collect.agent_kwargs["max_turns"] == 3  # still a config
    assert redacted(load_config(None)) == redacted(load_config(None, []))  # nothing to take out: unchanged


def test_a_child_gets_its_whole_config_outside_the_run_dir(tmp_path):
    cfg = load_config(None, SECRETS)
    record = tmp_path / "run" / "logs" / "endpoint-local.yaml"
    argv = procs.stage_argv("wharf.engine", cfg, record)
    whole = argv[argv.index("--config") + 1]
    assert not whole.startswith(str(tmp_path)) and whole.startswith(str(procs.private_dir()))
    assert load_config(whole).endpoint.api_key == "ep-secret-1"  # the child has what it needs
    assert stat.S_IMODE(os.stat(whole).st_mode) == 0o600 and stat.S_IMODE(os.stat(procs.private_dir()).st_mode) == 0o700
    assert not [v for v in VALUES if v in record.read_text()]  # the run dir's record: none of it


def test_a_trials_json_records_lose_the_runs_secrets_and_nothing_else(tmp_path):
    import json

    from wharf.core.config_redact import scrub_json_files
    trial = tmp_path / "trial"
    trial.mkdir()
    config = {"agent": {"env": {"WHARF_TEST_REGION": "eu-secret-7", "LANG": "C"}, "kwargs": {"api_key": "rollout-key-8"}},
              "task": {"path": "/tasks/answer"}}
    (trial / "config.json").write_text(json.dumps(config))
    (trial / "result.json").write_text(json.dumps({"config": config, "reward": 1.0}))
    (trial / "broken.json").write_text("{half")
    assert scrub_json_files(trial, ["eu-secret-7", "rollout-key-8", "", "C"]) == 2
    got = json.loads((trial / "result.json").read_text())["config"]
    assert got["agent"] == {"env": {"WHARF_TEST_REGION": REDACTED, "LANG": "C"}, "kwargs": {"api_key": REDACTED}}
    assert got["task"] == {"path": "/tasks/answer"} and (trial / "broken.json").read_text() == "{half"
