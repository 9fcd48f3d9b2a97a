import pytest

from collect.config import ConfigError, RunConfig, load_config, parse_override


def test_default_config_loads_and_overrides_apply():
    cfg = load_config("configs/default.yaml", ["collect.attempts=8", "sampling.temperature=0.7"])
    assert isinstance(cfg, RunConfig)
    assert cfg.collect.attempts == 8
    assert cfg.sampling.temperature == 0.7
    assert cfg.engine.served_name == "smollm2-135m"


def test_vllm_profile_loads():
    cfg = load_config("configs/vllm.yaml")
    assert cfg.endpoint.kind == "vllm"
    assert "--logprobs-mode=processed_logprobs" in cfg.endpoint.vllm_args


def test_unknown_key_names_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("collect:\n  atempts: 3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: unknown key 'collect.atempts'; did you mean 'attempts'"):
        load_config(bad)


def test_wrong_type_names_key():
    with pytest.raises(ConfigError, match=r"collect.attempts: expected int, got 'four'"):
        load_config("configs/default.yaml", ["collect.attempts=four"])


def test_int_accepted_for_float_and_null_for_optional():
    cfg = load_config(None, ["sampling.temperature=1", "engine.model=null"])
    assert cfg.sampling.temperature == 1.0 and isinstance(cfg.sampling.temperature, float)
    assert cfg.engine.model is None


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_override("collect.attempts")


def test_top_level_must_be_mapping(tmp_path):
    bad = tmp_path / "list.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(bad)
