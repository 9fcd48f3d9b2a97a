"""A run's policy names on a shared fleet (wharf/core/names.py): per run, stable where the run is
resumed, valid as a vLLM lora_name and an OpenAI `model`, and read back as versions."""
from __future__ import annotations

import re

from wharf.core.layout import RunLayout
from wharf.core.names import policy_name, policy_version, run_tag, weights_digest


def test_two_runs_of_one_name_get_their_own_names_and_a_resumed_run_keeps_its(tmp_path, monkeypatch):
    a, b = RunLayout(tmp_path / "expA" / "seed1"), RunLayout(tmp_path / "expB" / "seed1")
    assert a.policy(3) != b.policy(3) and a.policy(3).startswith("seed1-") and a.policy(3).endswith("-policy-v3")
    assert re.fullmatch(r"[A-Za-z0-9._-]+", run_tag(tmp_path / "a run: with / odd # chars"))
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "machine-1"))
    first = RunLayout.of("s3://bkt/runs", "seed1").policy(1)
    monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "machine-2"))  # another machine: another mirror path
    assert RunLayout.of("s3://bkt/runs", "seed1").policy(1) == first != RunLayout.of("s3://bkt/other", "seed1").policy(1)


def test_versions_read_back_from_the_run_s_names_and_the_names_before_them():
    tag = "seed1-0123abcd"
    assert policy_version(policy_name(4, tag)) == 4 and policy_version(policy_name(4)) == 4  # policy-v4: a stored run's
    assert policy_version("base-model", "base-model") == 0 and policy_version("gpt-4o") is None
    assert policy_version("seed1-ffffffff-policy-v2", None, tag) is None  # another run's: never unloaded as ours
    assert policy_version("policy-v2", None, tag) == 2 and policy_version(policy_name(2, tag), None, tag) == 2


def test_an_adapter_s_identity_is_its_weights(tmp_path):
    for d, data in (("a", b"one"), ("b", b"one"), ("c", b"two")):
        (tmp_path / d).mkdir()
        (tmp_path / d / "adapter_model.safetensors").write_bytes(data)
    assert weights_digest(tmp_path / "a") == weights_digest(tmp_path / "b") != weights_digest(tmp_path / "c")
    assert weights_digest(tmp_path / "missing") is None
