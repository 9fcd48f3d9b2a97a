"""Overlapping rounds (loop.max_staleness, wharf/pipeline/overlap.py): the lag rule and its messages,
the config checks, the importance-weight figures of the loss, and the overlapped loop over stored
rounds (the stub endpoint): health, the round's line and the report's overlap table. The live
kill-and-resume of both halves is in test_overlap_live.py (slow)."""
from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter

import pytest
import torch

from wharf.core.config import ConfigError, HealthConfig, load_config
from wharf.core.layout import RunLayout, policy_version
from wharf.pipeline.health import check_round
from wharf.pipeline.loop import run_loop
from wharf.pipeline.overlap import Published, StaleRowsError, allowed_policies, check_lag
from wharf.pipeline.report.data import gather_round, round_line
from wharf.pipeline.stages import write_marker
from wharf.train.loss import LossConfig, StepNorm, grpo_loss

from test_health import failed, write_round

BASE = "smollm2-135m"


def test_versions_and_the_policies_a_round_may_sample():
    assert [policy_version(p, BASE) for p in (BASE, "policy-v3", "policy-vx", "other", None)] == [0, 3, None, None, None]
    assert allowed_policies(0, 1, BASE) == (BASE,)
    assert allowed_policies(3, 0, BASE) == ("policy-v3",)
    assert allowed_policies(2, 2, BASE) == (BASE, "policy-v1", "policy-v2")
    assert allowed_policies(5, 1, BASE) == ("policy-v4", "policy-v5")


def test_rows_within_the_staleness_pass_with_their_lag():
    assert check_lag(Counter({"policy-v2": 10, "policy-v3": 4}), 3, 1, BASE, "f") == {"policy-v2": 1, "policy-v3": 0}
    assert check_lag(Counter({BASE: 7}), 2, 2, BASE, "f") == {BASE: 2}


def test_rows_from_a_policy_too_old_are_refused_naming_them():
    with pytest.raises(StaleRowsError) as e:
        check_lag(Counter({"policy-v1": 12, "policy-v3": 3}), 3, 1, BASE, "runs/r/rounds/3/convert/index.json")
    msg = str(e.value)
    assert msg.startswith("round 3 trains from policy-v3 on rows at most 1 policies behind (loop.max_staleness=1)")
    assert "runs/r/rounds/3/convert/index.json holds 12 rollouts by policy-v1 (2 behind)" in msg
    assert "policy-v3" not in msg.split("holds")[1]  # the rows that are fine are not named
    assert "Delete rounds/3/ to collect it again, or raise loop.max_staleness" in msg
    with pytest.raises(StaleRowsError, match="1 rollouts by gpt-4o \\(not a policy of this run\\)"):
        check_lag(Counter({"gpt-4o": 1}), 1, 2, BASE, "f")
    with pytest.raises(StaleRowsError, match="policy-v2 \\(-1 behind\\)"):  # a newer policy than trained: a mixed-up dir
        check_lag(Counter({"policy-v2": 1}), 1, 1, BASE, "f")
    with pytest.raises(StaleRowsError, match="round 1 trains from policy-v1 on rows at most 0"):  # the synchronous loop
        check_lag(Counter({BASE: 1}), 1, 0, BASE, "f")


def test_the_collector_waits_for_the_policy_it_needs():
    pub, stop = Published(), threading.Event()
    assert pub.wait(0, stop) < 0.1  # the base is published from the start
    threading.Timer(0.3, pub.set, (2,)).start()
    waited = pub.wait(2, stop)
    assert 0.25 < waited < 2 and pub.version == 2
    pub.set(1)
    assert pub.version == 2  # never goes back
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    pub.wait(5, stop)  # a stopped loop does not wait forever
    assert time.monotonic() - t0 < 2


def test_config_checks_staleness_against_the_adapters_the_endpoint_holds():
    assert load_config(None, ["loop.max_staleness=1"]).loop.max_staleness == 1
    with pytest.raises(ConfigError, match="loop.max_staleness"):
        load_config(None, ["loop.max_staleness=3"])
    with pytest.raises(ConfigError, match=r"keeps up to 3 adapters loaded .* but engine.max_loras=2: raise it to 3"):
        load_config(None, ["loop.max_staleness=2", "engine.max_loras=2"])
    load_config(None, ["loop.max_staleness=2", "engine.max_loras=3"])
    with pytest.raises(ConfigError, match="an evaluated copy.*engine.max_loras=3: raise it to 4"):  # evaluation loads one more
        load_config(None, ["loop.max_staleness=2", "engine.max_loras=3", "loop.eval_every=1", "loop.eval_dataset=d"])
    vllm = ["endpoint.kind=vllm", "loop.max_staleness=1"]
    with pytest.raises(ConfigError, match=r"vLLM --max-loras \(its default; endpoint.vllm_args has none\)=1"):
        load_config(None, vllm)
    with pytest.raises(ConfigError, match=r"vLLM --max-loras \(endpoint.vllm_args\)=1"):
        load_config(None, [*vllm, 'endpoint.vllm_args=[--max-loras,"1"]'])
    load_config(None, [*vllm, "endpoint.vllm_args=[--max-loras=2]"])
    with pytest.raises(ConfigError, match="--max-loras 'two' is not a number"):
        load_config(None, [*vllm, "endpoint.vllm_args=[--max-loras=two]"])
    load_config(None, [*vllm, "endpoint.launch=false"])  # a fleet wharf does not start: its own business
    load_config(None, ["endpoint.kind=vllm"])  # the synchronous loop never asks vLLM for more than it had


def test_importance_weights_by_hand():
    """Two tokens sampled by an older policy: exp(prox - behaviour) = 0.5 and 3 (capped at 2)."""
    behaviour = torch.tensor([[-1.0, -2.0]])
    prox = behaviour + torch.tensor([[math.log(0.5), math.log(3.0)]])
    mask, adv, w = torch.ones(1, 2), torch.tensor([1.0]), torch.tensor([1.0])
    _, stats = grpo_loss(prox.clone(), behaviour, mask, adv, w, LossConfig(mismatch="tis", mismatch_cap=2.0),
                         StepNorm(2, 1), prox=prox)
    assert stats["is_weight"].item() == pytest.approx(0.5 + 2.0)
    assert stats["is_capped"].item() == 1
    _, none = grpo_loss(prox.clone(), behaviour, mask, adv, w, LossConfig(mismatch="none"), StepNorm(2, 1))
    assert "is_weight" not in none


def _overlapped_round(layout: RunLayout, k: int, policy: str, lag: int, turn_policy: str | None = None) -> None:
    """A finished round of an overlapping loop: the markers say what sampled it, its lag and the waits."""
    rnd = layout.round(k)
    write_round(layout.round(k), policy, {"a": 1, "b": 3}, turn_policy=turn_policy, mismatch=0.4)
    write_marker(rnd, "collect", 1.0, policy=policy, lag=lag, waited_s=0.0 if lag else 7.5)
    write_marker(rnd, "convert", 1.0, waited_for_collect_s=12.0 + k)
    rnd.train.metrics.write_text("".join(json.dumps(
        {"step": i + 1, "rows": 8, "masked_rows": 0, "loss_tokens": t, "is_weight_mean": m, "is_capped": c}) + "\n"
        for i, (t, m, c) in enumerate(((300, 0.9, 0.0), (100, 1.3, 0.04)))))


def test_overlapped_loop_over_stored_rounds(tmp_path, stub, capsys, monkeypatch):
    """The real loop with max_staleness=1 over three stored rounds (every stage marked done): rounds 1
    and 2 were sampled one policy behind; the served mismatch of a lagged round is the policy
    change, not an error; the lag, the importance weights and the waits are in the line and the report."""
    over = [f"runs_dir={tmp_path}", "name=run", "rounds=3", f"endpoint.url={stub.url}", "endpoint.launch=false",
            "loop.check_model=false",
            "loop.max_staleness=1"]
    layout = RunLayout(tmp_path / "run")
    write_round(layout.round(0), BASE, {"a": 1, "b": 2})
    write_marker(layout.round(0), "collect", 1.0, policy=BASE, lag=0, waited_s=0.0)
    _overlapped_round(layout, 1, BASE, 1)
    _overlapped_round(layout, 2, "policy-v1", 1)
    served = []  # the stub loads no adapter: record what the loop asks to serve
    monkeypatch.setattr("wharf.pipeline.loop.ensure_served", lambda ep, cfg, v: served.append(v))
    assert run_loop(load_config(None, over)) == [0, 1, 2]
    assert served == [3]  # every collect was marked done: only the last policy, left serving
    for k in range(3):
        assert all(c["ok"] for c in json.loads(layout.round(k).health.read_text())), k
    check = json.loads(layout.round(2).health.read_text())[0]
    assert "1 policy behind policy-v2, as loop.max_staleness allows" in check["seen"]
    printed = capsys.readouterr().out
    assert ("round 2 (policy-v1): mean reward 0.500" in printed
            and "lag 1, |log-ratio| 0.400, importance weight 1.000 (1% capped), waited: collect 0 s, train 14 s" in printed)
    o = gather_round(layout, 1).overlap
    assert o == {"lag": 1, "collect_waited_s": 0.0, "train_waited_s": 13.0, "mismatch": 0.4, "is_weight_mean": pytest.approx(1.0),
                 "is_capped": pytest.approx(0.01)}
    assert "lag 0" in round_line(gather_round(layout, 0))
    page = layout.report.read_text()
    assert "Overlapping rounds (loop.max_staleness)" in page and "train waited for the collect s" in page


def test_a_lagged_round_by_a_policy_outside_the_staleness_is_named(tmp_path):
    layout = RunLayout(tmp_path / "run")
    _overlapped_round(layout, 3, "policy-v2", 1, turn_policy="policy-v1")
    allowed = allowed_policies(3, 1, BASE)
    bad = failed(check_round(layout.round(3), "policy-v2", HealthConfig(), allowed))
    assert list(bad) == ["policy_served"] and "16 of 16 calls by policy-v1" in bad["policy_served"].seen
    ok = failed(check_round(layout.round(3), "policy-v2", HealthConfig(), allowed_policies(3, 2, BASE)))
    assert ok == {}


def test_a_killed_collect_resumed_with_a_policy_now_too_old_is_refused(tmp_path, stub):
    """Round 2's collect started from the base model (its manifest says so) under max_staleness=2;
    resumed with max_staleness=1 it would be 2 behind: refused before anything samples."""
    over = [f"runs_dir={tmp_path}", "name=run", "rounds=3", f"endpoint.url={stub.url}", "endpoint.launch=false",
            "loop.check_model=false",
            "loop.max_staleness=1"]
    layout = RunLayout(tmp_path / "run")
    write_round(layout.round(0), BASE, {"a": 1, "b": 2})
    _overlapped_round(layout, 1, BASE, 1)
    layout.round(2).collect.root.mkdir(parents=True)
    layout.round(2).collect.manifest.write_text(json.dumps({"policy": BASE, "state": "running"}))
    with pytest.raises(StaleRowsError, match=r"round 2's collect was started from smollm2-135m \(.*manifest.json\), "
                       r"2 behind policy-v2; loop.max_staleness=1 allows 1"):
        run_loop(load_config(None, over))
    assert not (layout.round(2).collect.logs / "loop-collect.log").exists()  # no collect started
