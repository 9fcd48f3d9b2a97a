"""train.log_with's trackers (wharf/core/tracking.py) on synthetic metrics, each read back by its
own library: one tracker run per wharf run, continued across stages, step and round series on
their own axes, the config recorded with its credentials redacted; a round's figures from a run
dir written as the stages write theirs (wharf/pipeline/stages.py: track_round)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from wharf.core import tracking
from wharf.core.config import load_config
from wharf.core.layout import RunLayout

sys.path.insert(0, str(Path(__file__).parent))
import tracker_readers as read  # noqa: E402

ALL = ("tensorboard", "mlflow", "wandb")


def config(tmp_path, *over):
    return load_config(None, ["name=t", f"runs_dir={tmp_path}", "endpoint.api_key=sk-secret-1",
                              "collect.agent_env={OPENAI_API_KEY: sk-secret-2}", "train.lr=0.0003", *over])


def _installed(names):
    for n in names:
        pytest.importorskip(tracking.MODULES[n])


def test_every_tracker_keeps_one_run_across_stages(tmp_path, monkeypatch):
    _installed(ALL)
    cfg = config(tmp_path, "train.log_with=[tensorboard,mlflow,wandb]")
    run = tracking.TrackerRun.of(cfg)
    assert run.root == RunLayout(tmp_path / "t").trackers
    steps = {1: 0.5, 2: 0.4, 3: 0.3, 4: 0.25}
    with tracking.open_trackers(run) as t:  # round 0's train: two steps
        assert [x.name for x in t.trackers] == list(ALL)
        for s in (1, 2):
            t.log("train", {"loss": steps[s], "skipped": False, "tokens_per_s": None}, s)
    with tracking.open_trackers(run) as t:  # round 0 closed by the loop
        t.log("round", {"mean_reward": 0.25, "collect_s": 12.0}, 0)
    with tracking.open_trackers(run) as t:  # round 1: its steps numbered on, then the round
        for s in (3, 4):
            t.log("train", {"loss": steps[s]}, s)
        t.log("round", {"mean_reward": 0.5, "nan": float("nan")}, 1)

    want_steps, want_rounds = sorted(steps.items()), [(0, 0.25), (1, 0.5)]
    root = run.root
    assert read.tb_series(root, "t", "train/loss") == want_steps
    assert read.tb_series(root, "t", "round/mean_reward") == want_rounds
    assert read.tb_series(root, "t", "train/skipped") == [(1, 0.0), (2, 0.0)]
    tags = read.tensorboard(root, "t").Tags()
    assert "round/nan" not in tags["scalars"] and "train/tokens_per_s" not in tags["scalars"]
    assert tags["tensors"] == ["config/text_summary"]  # written once, by the run's first stage

    (found,) = read.mlflow_runs(root, "t", monkeypatch)  # one run, continued
    assert read.mlflow_series(root, "t", "train/loss", monkeypatch) == want_steps
    assert read.mlflow_series(root, "t", "round/mean_reward", monkeypatch) == want_rounds
    params = found.data.params
    assert params["train.lr"] == "0.0003" and params["endpoint.api_key"] == "<redacted>"
    assert params["collect.agent_env.OPENAI_API_KEY"] == "<redacted>"
    assert found.info.status == "FINISHED"

    records = read.wandb_records(root)
    assert len(records) == 3  # one offline run dir a stage, one run id: `wandb sync` joins them
    ids = {r["run"]["run_id"] for recs in records for r in recs if r["type"] == "run"}
    assert len(ids) == 1
    assert read.wandb_series(records, "train/loss", "step") == want_steps
    assert read.wandb_series(records, "round/mean_reward", "round") == want_rounds
    first = next(r["run"] for r in records[0] if r["type"] == "run")
    wb_config = first["config"]["update"]
    assert wb_config["train.lr"] == 0.0003 and wb_config["endpoint.api_key"] == "<redacted>"
    everything = "".join(p.read_bytes().decode("latin-1") for p in root.rglob("*") if p.is_file())
    assert "sk-secret" not in everything  # no credential in any tracker's files


def test_a_tracker_that_fails_is_dropped_and_the_others_go_on(tmp_path, caplog):
    _installed(["tensorboard"])
    run = tracking.TrackerRun.of(config(tmp_path, "train.log_with=[tensorboard]"))

    class Broken(tracking.Tracker):
        name = "broken"

        def log(self, series, values, step):
            raise OSError("disk full")

    t = tracking.open_trackers(run)
    t.trackers.insert(0, Broken(run))
    with t:
        t.log("train", {"loss": 1.0}, 1)
        t.log("train", {"loss": 2.0}, 2)
    assert read.tb_series(run.root, "t", "train/loss") == [(1, 1.0), (2, 2.0)]
    warned = [r.getMessage() for r in caplog.records if "broken" in r.getMessage()]
    assert warned == ["tracker broken: log failed (OSError: disk full); the run goes on without it"]


@pytest.mark.parametrize("command", ["train", "loop"])
def test_a_tracker_whose_package_is_missing_is_refused_by_name(tmp_path, monkeypatch, capsys, command):
    """`wharf train` and `wharf loop` refuse it first: one line, exit 1, nothing written (no model
    loaded, no endpoint started)."""
    import importlib

    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda m: None if m == "mlflow" else real(m))
    main = importlib.import_module(f"wharf.pipeline.{command}").main
    rc = main([f"runs_dir={tmp_path}", "name=t", "train.log_with=[tensorboard,mlflow]", "endpoint.launch=true"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and err == [f"wharf {command}: train.log_with names mlflow, but its package is not installed: "
                               "pip install -e '.[track]' (or pip install mlflow-skinny), or drop mlflow"]
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_tracker_is_a_config_error(tmp_path):
    from wharf.core.configio import ConfigError

    with pytest.raises(ConfigError, match=r"train.log_with\[0\]: 'trackio' is not one of tensorboard, mlflow, wandb"):
        config(tmp_path, "train.log_with=[trackio]")


def test_flat_config_is_scalars_with_credentials_redacted():
    got = tracking.flat({"a": {"b": 1, "api_key": "x", "env": {"HF_TOKEN": "y", "PATH": "/bin"}},
                         "max_tokens": 64, "l": [1, 2], "n": None, "e": {}})
    assert got == {"a.b": 1, "a.api_key": "<redacted>", "a.env.HF_TOKEN": "<redacted>", "a.env.PATH": "/bin",
                   "max_tokens": 64, "l": "[1, 2]", "n": "null", "e": "{}"}


def test_the_loop_tracks_each_round_once(tmp_path, monkeypatch):
    """track_round on a round written as the stages write it: its figures under round/*, x the
    round; a resumed loop walking the finished round again logs nothing twice."""
    _installed(["tensorboard"])
    from test_report import make_round
    from wharf.pipeline.stages import track_round

    cfg = config(tmp_path, "train.log_with=[tensorboard]")
    layout = RunLayout(tmp_path / "t")
    make_round(layout, 0, {"a": 1, "b": 2})
    make_round(layout, 1, {"a": 3, "b": 2})
    manifest = layout.round(1).collect.manifest  # as collect writes it: the endpoints' prefix-cache counters
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()),
                                    "prefix_cache": {"prompt_tokens": 3767, "cached_tokens": 3182, "hit_rate": 0.8447}}))
    for k in (0, 1, 1):
        track_round(_round(cfg, k))
    assert read.tb_series(layout.trackers, "t", "round/mean_reward") == [(0, 0.375), (1, 0.625)]
    tags = read.tensorboard(layout.trackers, "t").Tags()["scalars"]
    for key in ("success_rate", "groups_with_signal", "rows", "loss", "kl", "clip_fraction", "collect_s", "train_s",
                "completion_tokens_per_call", "mismatch_mean"):
        assert f"round/{key}" in tags, key
    assert read.tb_series(layout.trackers, "t", "round/clip_fraction") == [(0, 0.03), (1, 0.03)]
    assert read.tb_series(layout.trackers, "t", "round/prefix_cache_hit_rate") == [(1, 0.8447)]


def _round(cfg, k):
    import dataclasses

    return dataclasses.replace(cfg, round=k)
