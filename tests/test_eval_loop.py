"""The loop's held-out evaluation: its schedule, the eval marker it writes from eval's summary,
and the run report and round line that show held-out reward beside the training reward (the
loop end to end is tests/test_loop.py; its evaluation reuses wharf eval's collect, tested in
tests/test_eval.py)."""
from __future__ import annotations

import json

import pytest

from wharf.core.config import load_config
from wharf.core.layout import RunLayout
from wharf.pipeline import loop
from wharf.pipeline.eval import Policy, eval_name, write_summary
from wharf.pipeline.eval_stats import Trial
from wharf.pipeline.report import write_report
from wharf.pipeline.report.data import gather, round_line
from wharf.pipeline.report.plots import heldout_points
from wharf.pipeline.stages import run_stage
from test_report import make_round, referenced


def test_schedule():
    assert [k for k in range(6) if loop.eval_due(2, k)] == [1, 3, 5]  # after policy-v2, v4, v6
    assert [k for k in range(3) if loop.eval_due(1, k)] == [0, 1, 2]
    assert not any(loop.eval_due(0, k) for k in range(5))  # 0: off, the default
    assert load_config(None).loop.eval_every == 0


def _trials(rewards: dict[str, list[float]]) -> list[Trial]:
    return [Trial(t, a, r) for t, rs in rewards.items() for a, r in enumerate(rs)]


def fake_evaluate(scores: dict[int, dict[str, list[float]]]):
    """wharf eval's evaluate with the trials given (its collect is tested in test_eval.py)."""
    def evaluate(cfg, policies, ep):
        ev = cfg.layout.eval("heldout")
        return write_summary(ev, cfg, {p.label: (p, _trials(scores[p.round]), ev.policy(p.label)) for p in policies})
    return evaluate


def test_eval_stage_marks_the_new_policy_beside_the_base_and_the_report_shows_it(tmp_path, monkeypatch):
    cfg = load_config(None, [f"runs_dir={tmp_path}", "name=run", "loop.eval_every=1",
                             "loop.eval_dataset=datasets/multiturn/heldout", "eval.attempts=2"])
    layout = cfg.layout
    scores = {0: {"a": [0, 0], "b": [1, 0], "c": [0, 0]}, 1: {"a": [1, 0], "b": [1, 1], "c": [0, 0]},
              2: {"a": [1, 1], "b": [1, 1], "c": [1, 0]}}
    monkeypatch.setattr(loop, "evaluate", fake_evaluate(scores))
    for k, succ in enumerate([{"a": 1, "b": 2, "c": 0}, {"a": 3, "b": 2, "c": 1}]):
        make_round(layout, k, succ)
        (layout.round(k).train.adapter / "adapter_config.json").parent.mkdir(parents=True, exist_ok=True)
        (layout.round(k).train.adapter / "adapter_config.json").write_text("{}")
        rcfg = loop.round_config(cfg, k)
        assert run_stage(layout.round(k), "eval", lambda: loop.eval_stage(rcfg, ep=None))
    marker = json.loads(layout.round(1).marker("eval").read_text())
    assert (marker["policy"], marker["k"], marker["trials"]) == ("policy-v2", 2, 6)
    assert marker["mean"] == pytest.approx(5 / 6) and marker["base"]["mean"] == pytest.approx(1 / 6)
    assert marker["diff"]["mean"] == pytest.approx(4 / 6) and marker["diff"]["low"] < marker["diff"]["mean"]
    summary = json.loads(layout.eval("heldout").summary.read_text())
    assert set(summary["policies"]) == {"base", "run-policy-v1", "run-policy-v2"}  # the base once, kept

    rounds = gather(layout.root)
    assert [(k, round(m, 3)) for k, m, _, _ in heldout_points(rounds)] == [(0, 0.167), (1, 0.5), (2, 0.833)]
    line = round_line(rounds[1])
    assert "held-out (policy-v2): 0.833 [" in line and "base 0.167 [" in line and "mean reward 0.500" in line
    page = write_report(layout.root)
    assert "report/reward.png" in referenced(page) and (layout.root / "report" / "reward.png").is_file()
    text = page.read_text()
    assert "Evaluations" in text and f"{layout.root}:2 − base" in text and "<td>run-policy-v2</td>" not in text
    assert f"<td>{layout.root}:2</td>" in text


def test_rounds_without_evaluation_keep_their_line_and_plot(tmp_path):
    layout = RunLayout(tmp_path / "run")
    make_round(layout, 0, {"a": 1, "b": 2})
    rounds = gather(layout.root)
    assert heldout_points(rounds) == [] and "held-out" not in round_line(rounds[0])
    assert "Evaluations" not in write_report(layout.root).read_text()


def test_a_stored_policy_is_named_as_read_from_this_eval_or_from_its_runs_loop(tmp_path):
    """The log line of a policy not run again says whose trials are read (was: "its run already
    ran" for this eval's own finished job too)."""
    from wharf.pipeline.eval import stored_note
    from wharf.core.layout import EvalLayout

    ev = EvalLayout(tmp_path / "cmp" / "evals" / "heldout")
    p = Policy("runs/grpo:2", "grpo-policy-v2", tmp_path / "adapter", 2)
    own = stored_note(ev, p, ev.policy(p.label))
    loops = stored_note(ev, p, RunLayout(tmp_path / "grpo" / "evals" / "heldout" / p.label))
    assert "already in this eval" in own and "run's loop" not in own and str(ev.policy(p.label).root) in own
    assert "run's loop already ran" in loops and str(tmp_path / "grpo") in loops


def test_a_warm_started_loop_is_measured_against_its_init_adapter(tmp_path, monkeypatch):
    """With loop.init_adapter the reference is policy-v0 (the SFT adapter), not the base: the
    difference is what the run's own rounds added (the warm-start experiment's measure)."""
    sft = RunLayout(tmp_path / "sft")
    sft.round(0).train.adapter.mkdir(parents=True)
    (sft.round(0).train.adapter / "adapter_config.json").write_text("{}")
    cfg = load_config(None, [f"runs_dir={tmp_path}", "name=run", "loop.eval_every=1",
                             "loop.eval_dataset=datasets/multiturn/heldout", "eval.attempts=2",
                             f"loop.init_adapter={sft.root}:1"])
    seen = []
    def evaluate(ecfg, policies, ep):
        seen.append([p.spec for p in policies])
        scores = {"sft-policy-v1": {"a": [1, 0], "b": [0, 0]}, "run-policy-v1": {"a": [1, 1], "b": [1, 0]}}
        ev = ecfg.layout.eval("heldout")
        return write_summary(ev, ecfg, {p.label: (p, _trials(scores[p.label]), ev.policy(p.label)) for p in policies})
    monkeypatch.setattr(loop, "evaluate", evaluate)
    make_round(cfg.layout, 0, {"a": 1, "b": 2})
    (cfg.layout.round(0).train.adapter / "adapter_config.json").parent.mkdir(parents=True, exist_ok=True)
    (cfg.layout.round(0).train.adapter / "adapter_config.json").write_text("{}")
    assert run_stage(cfg.layout.round(0), "eval", lambda: loop.eval_stage(loop.round_config(cfg, 0), ep=None))
    assert seen == [[f"{sft.root}:1", f"{cfg.layout.root}:1"]]  # the base is not evaluated
    marker = json.loads(cfg.layout.round(0).marker("eval").read_text())
    assert marker["start"] == f"{sft.root}:1" and marker["base"]["mean"] == pytest.approx(1 / 4)
    assert marker["mean"] == pytest.approx(3 / 4) and marker["diff"]["mean"] == pytest.approx(2 / 4)
    assert "policy-v0 0.250" in round_line(gather(cfg.layout.root)[0])


def test_the_table_of_warm_started_runs_reads_rounds_eval_and_families(tmp_path, monkeypatch, capsys):
    """`wharf report --table`: a row per run (reward, cut answers, mixed groups per round; the last
    held-out evaluation against policy-v0) and a line with pass@k and successes per task family."""
    from wharf.pipeline.report.cli import main as report_main

    sft = RunLayout(tmp_path / "sft")
    (sft.round(0).train.adapter).mkdir(parents=True)
    (sft.round(0).train.adapter / "adapter_config.json").write_text("{}")
    cfg = load_config(None, [f"runs_dir={tmp_path}", "name=run", "loop.eval_every=2",
                             "loop.eval_dataset=datasets/multiturn/heldout", "eval.attempts=2",
                             f"loop.init_adapter={sft.root}:1"])
    scores = {"sft-policy-v1": {"cat-note-1": [1, 0], "cat-note-2": [0, 0], "grep-log-1": [0, 0]},
              "run-policy-v2": {"cat-note-1": [1, 1], "cat-note-2": [1, 0], "grep-log-1": [1, 0]}}

    def evaluate(ecfg, policies, ep):
        ev = ecfg.layout.eval(eval_name(ecfg))  # where wharf eval writes, and the marker points
        return write_summary(ev, ecfg, {p.label: (p, _trials(scores[p.label]), ev.policy(p.label)) for p in policies})
    monkeypatch.setattr(loop, "evaluate", evaluate)
    for k, successes in ((0, {"a": 1, "b": 0}), (1, {"a": 3, "b": 4})):
        make_round(cfg.layout, k, successes)
        stats = cfg.layout.round(k).convert.stats
        stats.write_text(json.dumps({**json.loads(stats.read_text()), "turns": {"cut_answers": 3 - k, "used_calls": 10}}))
        (cfg.layout.round(k).train.adapter).mkdir(parents=True)
        (cfg.layout.round(k).train.adapter / "adapter_config.json").write_text("{}")
    assert run_stage(cfg.layout.round(1), "eval", lambda: loop.eval_stage(loop.round_config(cfg, 1), ep=None))
    assert report_main(["--table", str(cfg.layout.root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| run | training reward r0..r1 | cut at max_tokens r0..r1 | mixed groups r0..r1 |")
    row = out[2].split(" | ")
    assert row[1:4] == ["0.125 / 0.875", "3/10 / 2/10", "1 / 1"], row  # b: 4 of 4 is no group with signal
    assert row[4].startswith("0.167") and row[5].startswith("0.667") and row[6].startswith("**0.500")
    detail = next(line for line in out if line.startswith("- run:"))
    assert "pass@2 0.333 -> 1.000" in detail, detail
    assert "successes per family: cat-note 1->3, grep-log 0->1" in detail, detail  # near-copies summed per family
    assert capsys.readouterr().out == ""
    assert report_main(["--table", str(tmp_path / "nothing")]) != 0
    assert "nothing: not a run dir with rounds" in capsys.readouterr().err


def test_a_round_trained_again_drops_the_held_out_figures_of_its_old_weights(tmp_path, monkeypatch):
    """Round 0 evaluated, then trained again (its train marker removed): the eval marker, whose
    figures are the old weights', goes with the publish marker, so neither the round's line nor the
    report shows them as the new weights'; the loop evaluates the new weights again."""
    from wharf.pipeline.report.data import gather_round
    from wharf.pipeline.stages import read_marker, write_marker

    cfg = load_config(None, [f"runs_dir={tmp_path}", "name=r", "round=0"])
    rnd = cfg.layout.round(0)
    make_round(cfg.layout, 0, {"a": 1, "b": 2})
    rnd.marker("train").unlink(missing_ok=True)  # the way to train a round again
    for stage in ("collect", "convert", "publish"):
        write_marker(rnd, stage, 1.0)
    write_marker(rnd, "eval", 1.0, policy="policy-v1", k=1, mean=0.9, low=0.8, high=1.0, tasks=4,
                 base={"mean": 0.1, "low": 0.0, "high": 0.2, "tasks": 4}, diff={"mean": 0.8, "low": 0.7, "high": 0.9, "tasks": 4})
    assert gather_round(cfg.layout, 0).heldout  # the old weights' figures, shown while they hold
    monkeypatch.setattr(loop, "train_checked", lambda c: {"steps": 1})
    monkeypatch.setattr(loop, "measure_shift", lambda c: None)
    monkeypatch.setattr(loop, "publish_stage", lambda c, ep: {"published": True})
    loop.learn_round(cfg, None)
    assert read_marker(rnd, "eval") is None and not gather_round(cfg.layout, 0).heldout
    assert "held-out" not in round_line(gather_round(cfg.layout, 0))
