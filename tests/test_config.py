import pytest

from wharf.core.config import ConfigError, RunConfig, dump_config, load_config, parse_override


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


@pytest.mark.parametrize("override,message", [
    ("proxy.port=70000", r"proxy.port: input should be less than or equal to 65535 \(got 70000\)"),
    ("sampling.top_p=0", r"sampling.top_p: input should be greater than 0"),
    ("sampling.temperature=-1", r"sampling.temperature: input should be greater than 0"),
    ("collect.attempts=0", r"collect.attempts: input should be greater than or equal to 1"),
    ("collect.tasks=[1]", r"collect.tasks\[0\]: expected str, got 1"),
    ("engine=3", r"engine: expected a mapping, got 3"),
])
def test_values_out_of_range_or_shape_name_the_key(override, message):
    with pytest.raises(ConfigError, match=r"^defaults: " + message):
        load_config(None, [override])


@pytest.mark.parametrize("override,message", [
    # every section is checked when the config loads, the stages' sections included
    ("convert.advantage=ppo", r"convert.advantage: 'ppo' is not one of grpo, dr_grpo, rloo, zero"),
    ("convert.overlong=cut", r"convert.overlong: 'cut' is not one of truncate, drop"),
    ("convert.length_completions=drop", r"convert.length_completions: 'drop' is not one of mask, keep"),
    ("convert.context_exceeded=drop", r"convert.context_exceeded: 'drop' is not one of mask, keep"),
    ("convert.max_seq_len=0", r"convert.max_seq_len: input should be greater than or equal to 1"),
    ("convert.pad_multiple=0", r"convert.pad_multiple: input should be greater than or equal to 1"),
    ("convert.max_row_padding=1.5", r"convert.max_row_padding: input should be less than or equal to 1"),
    ("train.lr=0", r"train.lr: input should be greater than 0"),
    ("train.epochs=0", r"train.epochs: input should be greater than or equal to 1"),
    ("train.eps_low=-0.1", r"train.eps_low: input should be greater than or equal to 0"),
    ("train.loss_agg=sum", r"train.loss_agg: 'sum' is not one of token_mean, seq_mean, constant"),
    ("train.mismatch=clip", r"train.mismatch: 'clip' is not one of tis, mask, none"),
    ("train.mixed_precision=fp8", r"train.mixed_precision: 'fp8' is not one of no, bf16, fp16"),
    ("train.device=tpu", r"train.device: 'tpu' is not one of auto, cpu, cuda"),
    ("engine.dtype=int8", r"engine.dtype: 'int8' is not one of float32, bfloat16, float16"),
    ("train.lora_rank=128", r"train.lora_rank=128 is above train.max_lora_rank=64"),
    ("train.lora_target_modules=[]", r"train.lora_target_modules is empty"),
    # a rule across sections: Dr. GRPO's constant must be fixed before any round trains
    ("train.loss_agg=constant", r"train.loss_agg=constant needs a constant fixed for the run"),
])
def test_stage_sections_are_checked_at_load_time(tmp_path, override, message):
    f = tmp_path / "run.yaml"
    f.write_text("name: x\n")
    with pytest.raises(ConfigError, match=rf"^{f}: " + message):
        load_config(f, [override])


def test_help_lists_every_key_with_its_default(capsys):
    from wharf.core.config import cli_config

    with pytest.raises(SystemExit) as e:
        cli_config(["--help"], "wharf loop")
    out = capsys.readouterr().out
    assert e.value.code == 0
    for line in ("  convert.advantage = 'grpo'", "  train.lr = 0.0002", "  collect.attempts = 4", "  rounds = 1"):
        assert line in out
    with pytest.raises(SystemExit):  # a stage's --help: the keys it reads
        cli_config(["--help"], "wharf train")
    out = capsys.readouterr().out
    assert "  train.lr = 0.0002" in out and "  convert.advantage = 'grpo'" in out and "  collect.attempts" not in out


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["collect.attempts=0", "proxy.prot=1"])
    assert "collect.attempts" in str(e.value) and "unknown key 'proxy.prot'; did you mean 'port'" in str(e.value)


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config("configs/default.yaml", ["collect.tasks=[a,b]"])
    dump_config(cfg, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg


def test_exponent_floats_are_floats(tmp_path):
    (tmp_path / "c.yaml").write_text("train:\n  lr: 1e-5\n")
    assert load_config(tmp_path / "c.yaml").train.lr == 1e-5
    assert load_config(None, ["train.lr=2e-4"]).train.lr == 2e-4
    assert load_config(None, ["name=1e3x"]).name == "1e3x"


def test_only_true_and_false_are_booleans():
    cfg = load_config(None, ["train.mixed_precision=no", "endpoint.launch=false"])
    assert cfg.train.mixed_precision == "no" and cfg.endpoint.launch is False
    assert load_config(None, ["endpoint.launch=no"]).endpoint.launch is False  # a bool field still reads no


def test_the_docs_list_every_key_with_its_default():
    from pathlib import Path

    from wharf.core.configio import keys_help

    page = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    block = "\n".join(keys_help(RunConfig))
    assert f"```\n{block}\n```" in page, \
        "docs/configuration.md's key list is stale: print keys_help(RunConfig) into it (the command is on that page)"


def test_greedy_sampling_is_refused_at_load():
    # the trainer divides logits by the temperature; the endpoint reports greedy log-probs at 1
    with pytest.raises(ConfigError, match="sampling.temperature"):
        load_config(None, ["sampling.temperature=0"])


def test_top_p_below_one_needs_the_opt_in():
    # the trainer scores the full softmax; a truncated sampling distribution is not corrected
    with pytest.raises(ConfigError, match="sampling.top_p=0.9 .* sampling.top_p_uncorrected"):
        load_config(None, ["sampling.top_p=0.9"])
    assert load_config(None, ["sampling.top_p=0.9", "sampling.top_p_uncorrected=true"]).sampling.top_p == 0.9


def test_a_dict_override_merges_and_tilde_removes_what_the_file_set():
    """As Hydra's command line: `key={...}` merges into the file's dict; `~key` drops it first, e.g.
    to run another agent on a config whose agent_kwargs are the minimal agent's."""
    mini = "collect.agent=wharf.collect.agents.mini_swe:LocalMiniSweAgent"
    merged = load_config("configs/learn.yaml", [mini, "collect.agent_kwargs={step_limit: 3}"])
    assert merged.collect.agent_kwargs["step_limit"] == 3 and merged.collect.agent_kwargs["max_turns"] == 1
    only = load_config("configs/learn.yaml", [mini, "~collect.agent_kwargs", "collect.agent_kwargs={step_limit: 3}"])
    assert only.collect.agent_kwargs == {"step_limit": 3}
    back = load_config("configs/learn.yaml", ["~train.lr", "~no.such.key"])  # the default again; nothing there: no-op
    assert back.train.lr == RunConfig().train.lr != load_config("configs/learn.yaml").train.lr
    for bad in ("~", "~collect..agent", "~collect.agent=x"):
        with pytest.raises(ConfigError, match="expected ~key"):
            load_config("configs/learn.yaml", [bad])
