"""The loop's health checks (wharf/pipeline/health.py) fire on the rounds they exist for, and say so.

Rounds are written the way the stages write theirs (turns and rollouts through wharf.schema,
convert's stats.json, train's result.json and metrics.jsonl, the loop's markers); the policy
shift is measured on real micro-batches with real peft adapters; one test runs the real loop
(against the stub endpoint) over a stored round and reads the message it stops with."""
from __future__ import annotations

import json
import math

import pytest
import torch

from wharf.core import schema
from wharf.core.config import ConfigError, HealthConfig, load_config
from wharf.core.layout import RoundLayout, RunLayout
from wharf.pipeline.health import HealthError, check_round, enforce
from wharf.pipeline.loop import run_loop
from wharf.pipeline.stages import write_marker
from wharf.train.records import TrainResult
from wharf.train.shift import shift_stats, weight_delta

from test_report import NOW, _rollouts

OK_SHIFT = {"tokens": 120, "delta_mean": 0.05, "delta_max": 0.4, "kl": 0.002, "weight_delta": 0.01}


def write_round(rnd: RoundLayout, policy: str, rewards: dict[str, int], *, turn_policy: str | None = None,
                turn_status: str = "ok", trainable: int = 500, left_out: dict | None = None,
                mismatch: float = 1e-5, shift: dict | None = OK_SHIFT, masked: int = 0,
                grad_norms: tuple[float, ...] = (0.4, 1.2), cut: int = 0, timeouts: int = 0) -> None:
    """A finished round: 4 attempts per task, rewards[task] of them successful; the first `cut`
    of its 2 answers a rollout ran to max_tokens; its first `timeouts` failed rollouts ran out of time."""
    rows = _rollouts(rnd.k, rewards)
    for r in rows:
        r["policy"] = policy
    for r in [r for r in rows if r["reward"] == 0.0][:timeouts]:
        r["status"], r["error"] = "agent_timeout", "AgentTimeoutError: Agent execution timed out after 600.0 seconds"
    schema.write_table(rnd.collect.rollouts, "rollouts", rows)
    turns = [{"rollout_id": r["rollout_id"], "turn": t, "request_id": f"{r['rollout_id']}-{t}", "api": "chat",
              "policy": turn_policy or policy, "started_at": NOW, "ended_at": NOW, "request": "{}",
              "response": "{}", "sampling": "{}", "prompt_token_ids": [1, 2, 3],
              "completion_token_ids": [4, 5] if turn_status == "ok" else [],
              "completion_logprobs": [-0.5, -0.5] if turn_status == "ok" else [], "finish_reason": "stop",
              "status": turn_status, "error": None if turn_status == "ok" else "upstream: connection refused"}
             for r in rows for t in range(2)]
    for turn in turns[:cut]:
        turn["finish_reason"] = "length"
    schema.write_table(rnd.collect.turns / "part-00000.parquet", "turns", turns)
    rnd.convert.root.mkdir(parents=True)
    rnd.convert.stats.write_text(json.dumps({
        "rollouts": {"read": len(rows), "used": len(rows) - sum((left_out or {}).values()),
                     "left_out": {**(left_out or {}), **({} if trainable else {"group_no_signal": len(rows)})}},
        "groups": {"used": len(rewards) if trainable else 0, "dropped": {} if trainable else {"no_signal": len(rewards)}},
        "tokens": {"total": 10 * len(rows), "trainable": trainable},
        "rows": {"count": len(rows), "rows_per_rollout_mean": 1.5},
        "turns": {"used_calls": 12, "repeated_answers": 3, "cut_answers": 6},
        "prefix_breaks": {"total": 2, "by_agent": {"wharf-minimal": {"pairs": 8, "breaks": 2}}}}))
    rnd.train.root.mkdir(parents=True)
    if trainable:
        rnd.train.metrics.write_text("".join(json.dumps({"step": i + 1, "rows": len(rows) if i == 0 else 0,
                                                         "masked_rows": masked if i == 0 else 0, "grad_norm": g,
                                                         "kl": 0.01 * g}) + "\n" for i, g in enumerate(grad_norms)))
        TrainResult(round=rnd.k, policy=f"policy-v{rnd.k + 1}", adapter=str(rnd.train.adapter), steps=1, skipped_steps=0,
                    loss_tokens=trainable, mismatch_mean=mismatch, mismatch_max=10 * mismatch, wall_s=1.0).write(rnd.train.result)
        if shift is not None:
            rnd.train.shift.write_text(json.dumps(shift))
    for stage in ("collect", "convert", "train", "publish"):
        info = {"carried": "policy-v0"} if stage == "train" and not trainable else {}
        write_marker(rnd, stage, 1.0, **info, **({"policy": policy} if stage == "collect" else {}))  # as the loop's


def failed(checks) -> dict:
    return {c.name: c for c in checks if not c.ok}


def test_a_healthy_round_passes_and_is_written(tmp_path):
    rnd = RunLayout(tmp_path / "run").round(1)
    write_round(rnd, "policy-v1", {"a": 1, "b": 3})
    checks = check_round(rnd, "policy-v1", HealthConfig())
    assert [c.name for c in checks] == ["policy_served", "trainable_tokens", "policy_moved", "steps_stable", "bad_share",
                                        "answers_ended", "agents_in_time", "replicas_serve"]
    assert failed(checks) == {}
    enforce(checks)
    assert [c["ok"] for c in json.loads(rnd.health.read_text())] == [True] * 8


# A share that rose over round 0's: (check, write_round's knob for rounds 0, 1, 2, the config key
# and a value it passes at, what the check saw in round 2, the file it read).
RISES = [
    # the policy no longer ends its answers: 2 of 16 cut at max_tokens in round 0, 12 of 16 in round 2
    ("answers_ended", "cut", (2, 6, 12), "max_cut_rise", 0.7, "12 of 16 answers cut (75%)", "round 0: 2 of 16 (12%)",
     lambda rnd: rnd.collect.turns),
    # agents run out of time (a slower host, or a policy that learned endless commands): 1 of 8, then 4 of 8
    ("agents_in_time", "timeouts", (1, 3, 4), "max_timeout_rise", 0.4, "4 of 8 rollouts ran out of time (50%)",
     "round 0: 1 of 8 (12%)", lambda rnd: rnd.collect.rollouts),
]


@pytest.mark.parametrize("name, knob, counts, key, passes, seen, seen0, file", RISES, ids=[r[0] for r in RISES])
def test_a_share_rising_over_round_0s_fires_its_check(tmp_path, name, knob, counts, key, passes, seen, seen0, file):
    layout = RunLayout(tmp_path / "run")
    for k, n in enumerate(counts):  # round 1 within 30 points of round 0 (12.5% -> 37.5%)
        write_round(layout.round(k), f"policy-v{k}", {"a": 0 if k == 2 else 1, "b": 3}, **{knob: n})
        bad = failed(check_round(layout.round(k), f"policy-v{k}", HealthConfig()))
        assert list(bad) == ([name] if k == 2 else []), k
    assert bad[name].seen.startswith(f"{seen}, {seen0}")
    assert bad[name].file == str(file(layout.round(2)))
    assert f"loop.health.{key}=1" in bad[name].message()
    for value in (passes, 1):
        assert failed(check_round(layout.round(2), "policy-v2", HealthConfig(**{key: value}))) == {}
    alone = RunLayout(tmp_path / "resumed").round(2)  # no round 0 on this disk: nothing to compare with
    write_round(alone, "policy-v2", {"a": 0, "b": 3}, **{knob: counts[2]})
    check = next(c for c in check_round(alone, "policy-v2", HealthConfig()) if c.name == name)
    assert check.ok and check.seen == f"{seen}; no round 0 to compare with"


def test_adapter_not_loaded_fires_policy_served(tmp_path):
    """Round 1's calls went to the base model (the adapter never reached the endpoint)."""
    rnd = RunLayout(tmp_path / "run").round(1)
    write_round(rnd, "policy-v1", {"a": 1, "b": 3}, turn_policy="smollm2-135m")
    bad = failed(check_round(rnd, "policy-v1", HealthConfig()))
    assert list(bad) == ["policy_served"]
    with pytest.raises(HealthError) as e:
        enforce(list(bad.values()))
    msg = str(e.value)
    assert msg.startswith("round 1: health check 'policy_served' failed: expected every call sampled by policy-v1")
    assert "16 of 16 calls by smollm2-135m" in msg and str(rnd.collect.turns) in msg
    assert "loop.health.policy_served=false" in msg
    assert failed(check_round(rnd, "policy-v1", HealthConfig(policy_served=False))) == {}


def test_endpoint_serving_other_weights_fires_policy_served(tmp_path):
    """The name was right but the trainer's log-probs of policy-v1 are far from the endpoint's."""
    rnd = RunLayout(tmp_path / "run").round(1)
    write_round(rnd, "policy-v1", {"a": 1, "b": 3}, mismatch=0.7)
    bad = failed(check_round(rnd, "policy-v1", HealthConfig()))
    assert list(bad) == ["policy_served"] and "mismatch 0.7: the endpoint served other weights" in bad["policy_served"].seen
    assert failed(check_round(rnd, "policy-v1", HealthConfig(max_served_mismatch=0))) == {}


def test_dead_endpoint_fires_served_and_bad_share(tmp_path):
    """Every call failed upstream; convert left every rollout out (no turns to train on)."""
    rnd = RunLayout(tmp_path / "run").round(0)
    write_round(rnd, "smollm2-135m", {"a": 0, "b": 0}, turn_status="error", left_out={"no_turns": 8}, trainable=0)
    bad = failed(check_round(rnd, "smollm2-135m", HealthConfig()))
    assert set(bad) == {"policy_served", "trainable_tokens", "bad_share"}
    assert "none of 16 calls answered (error: 16)" in bad["policy_served"].seen
    assert bad["bad_share"].seen.startswith("8 of 8 rollouts left out (no_turns: 8)")
    assert bad["bad_share"].file == str(rnd.convert.stats) and "loop.health.max_bad_share=1" in bad["bad_share"].message()


def test_masked_rows_count_as_bad(tmp_path):
    rnd = RunLayout(tmp_path / "run").round(1)
    write_round(rnd, "policy-v1", {"a": 1, "b": 3}, masked=6)  # 6 of 8 rows masked by the trainer
    bad = failed(check_round(rnd, "policy-v1", HealthConfig()))
    assert list(bad) == ["bad_share"] and "6 of 8 rows masked" in bad["bad_share"].seen
    assert bad["bad_share"].file == str(rnd.train.metrics)
    assert failed(check_round(rnd, "policy-v1", HealthConfig(max_bad_share=0.8))) == {}


def test_all_equal_round_fires_trainable_tokens(tmp_path):
    rnd = RunLayout(tmp_path / "run").round(2)
    write_round(rnd, "policy-v2", {"a": 4, "b": 4}, trainable=0)
    bad = failed(check_round(rnd, "policy-v2", HealthConfig()))
    assert list(bad) == ["trainable_tokens"]  # policy_moved: not trained, nothing to check
    assert bad["trainable_tokens"].seen == "0 loss tokens (every group's rewards were equal: nothing to learn from)"
    assert bad["trainable_tokens"].file == str(rnd.convert.stats)
    assert failed(check_round(rnd, "policy-v2", HealthConfig(min_trainable_tokens=0))) == {}


def test_policy_that_did_not_move_fires(tmp_path):
    rnd = RunLayout(tmp_path / "run").round(1)
    write_round(rnd, "policy-v1", {"a": 1, "b": 3}, shift={"tokens": 120, "delta_mean": 0.0, "delta_max": 0.0,
                                                           "kl": 0.0, "weight_delta": 0.0})
    bad = failed(check_round(rnd, "policy-v1", HealthConfig()))
    assert list(bad) == ["policy_moved"] and bad["policy_moved"].file == str(rnd.train.shift)
    assert "mean |delta log-prob| 0 over 120 tokens" in bad["policy_moved"].seen
    assert failed(check_round(rnd, "policy-v1", HealthConfig(min_policy_shift=0))) == {}
    (rnd.train.shift).unlink()  # never measured: fails too
    assert failed(check_round(rnd, "policy-v1", HealthConfig()))["policy_moved"].seen == "no shift measured"


@pytest.mark.parametrize("which", ["turns", "rollouts", "round 0's rollouts"])
def test_a_corrupt_table_is_one_line_naming_it(tmp_path, which):
    """A cut shard of turns, or a cut rollouts table (round 1's, or round 0's that the checks
    comparing with it read): an error naming the file, not a check that passes on nothing."""
    run = RunLayout(tmp_path / "run")
    write_round(run.round(0), "policy-v0", {"a": 1, "b": 3})
    rnd = run.round(1)
    write_round(rnd, "policy-v1", {"a": 1, "b": 3})
    bad = {"turns": rnd.collect.turns / "part-00000.parquet", "rollouts": rnd.collect.rollouts,
           "round 0's rollouts": run.round(0).collect.rollouts}[which]
    bad.write_bytes(bad.read_bytes()[:200])  # cut short, as by a full disk
    with pytest.raises(schema.SchemaError) as e:
        check_round(rnd, "policy-v1", HealthConfig())
    assert str(bad) in str(e.value) and "not a readable parquet file" in str(e.value) and "\n" not in str(e.value)


def test_health_config_is_validated():
    assert load_config(None, ["loop.health.min_policy_shift=0"]).loop.health.min_policy_shift == 0
    with pytest.raises(ConfigError, match="loop.health.max_bad_share"):
        load_config(None, ["loop.health.max_bad_share=1.5"])
    with pytest.raises(ConfigError, match="unknown key 'loop.health.min_shift'"):
        load_config(None, ["loop.health.min_shift=0"])
    assert load_config(None, ["loop.health.max_grad_norm=0"]).loop.health.max_grad_norm == 0
    with pytest.raises(ConfigError, match="loop.health.max_grad_norm"):
        load_config(None, ["loop.health.max_grad_norm=-1"])
    with pytest.raises(ConfigError, match="loop.health.max_grad_norm"):
        load_config(None, ["loop.health.max_grad_norm=big"])


def test_shift_stats_by_hand():
    s = shift_stats([[0.0, math.log(2)], [-math.log(2)]])
    assert s["tokens"] == 3 and s["delta_mean"] == pytest.approx(2 * math.log(2) / 3)
    # KL k3 terms: exp(d) - 1 - d: 0, 1 - ln 2, -0.5 + ln 2
    assert s["kl"] == pytest.approx((0 + (1 - math.log(2)) + (-0.5 + math.log(2))) / 3)
    a = {"x.lora_A.weight": torch.ones(2, 2), "x.lora_B.weight": torch.zeros(2, 2)}
    assert weight_delta(a, None) == 0.0
    assert weight_delta({**a, "x.lora_B.weight": torch.full((2, 2), -0.25)}, a) == 0.25


def test_loop_stops_on_an_unhealthy_stored_round(tmp_path, stub, capsys):
    """The real loop over two stored rounds (every stage marked done): round 1 was sampled by the
    base model, so the loop stops after it with the check's message."""
    over = [f"runs_dir={tmp_path}", "name=run", "rounds=2", f"endpoint.url={stub.url}", "endpoint.launch=false",
            "loop.check_model=false"]  # the stub's toy tokens are not the model's
    layout = RunLayout(tmp_path / "run")
    write_round(layout.round(0), "smollm2-135m", {"a": 1, "b": 2})
    write_round(layout.round(1), "policy-v1", {"a": 2, "b": 3}, turn_policy="smollm2-135m")
    with pytest.raises(HealthError, match=r"^round 1: health check 'policy_served' failed"):
        run_loop(load_config(None, over))
    assert json.loads(layout.round(0).health.read_text())[0]["ok"] is True
    printed = capsys.readouterr().out  # each round's figures, as the loop prints them
    assert ("loop: round 0 (smollm2-135m): mean reward 0.375, success 0.375, calls/rollout 2.00, rows/rollout 1.50, "
            "prefix breaks 2/8 pairs (25%), repeated answers 3/12 calls (25%), cut at max_tokens 6/12 (50%), "
            "trainable tokens 500, "
            "|delta log-prob| 0.05, KL to previous 0.002") in printed
    assert "policy_served" in layout.report.read_text() and "FAILED" in layout.report.read_text()


def _adapters(tmp_path):
    """Two real peft adapters of the embedded model: lora_B = 0 (the base model) and one moved off it."""
    from peft import LoraConfig, get_peft_model

    from train_util import base

    model, _ = base()
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    peft.save_pretrained(str(tmp_path / "zero"))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    peft.save_pretrained(str(tmp_path / "moved"))
    peft.unload()  # the shared base model without LoRA layers again
    return tmp_path / "zero", tmp_path / "moved"


@pytest.mark.slow  # ~15 s idle: samples 4 rows and runs the model 6 times
def test_shift_measured_on_real_adapters(tmp_path):
    from wharf.core.model_store import embedded_model_dir
    from wharf.train.shift import measure
    from train_util import sample_rows
    from train_util import write_round as write_batches

    rows = sample_rows(4, 8, 1.0, 0)
    write_batches(tmp_path / "convert", rows, [1.0, -1.0, 1.0, -1.0], 1.0)
    zero, moved = _adapters(tmp_path)
    still = measure(tmp_path / "convert", embedded_model_dir(), zero, None)
    assert still["tokens"] == 32 and still["delta_mean"] < 1e-6 and still["weight_delta"] == 0.0
    off = measure(tmp_path / "convert", embedded_model_dir(), moved, None)
    assert off["delta_mean"] > 1e-3 and off["kl"] > 0 and off["weight_delta"] > 0.01
    again = measure(tmp_path / "convert", embedded_model_dir(), moved, zero)  # from an adapter, not the base
    assert again["delta_mean"] == pytest.approx(off["delta_mean"], rel=1e-3)
    assert again["weight_delta"] == pytest.approx(off["weight_delta"])


@pytest.mark.slow  # shares test_shift_measured_on_real_adapters's sampled rows
def test_measured_log_probs_are_a_full_forward_s_at_the_loss_tokens(tmp_path):
    """The update's measurement and the replay check score the loss tokens alone (train.offpolicy),
    with the log-probs of a full forward there (all positions through the model's own head)."""
    import torch

    from wharf.core.batches import load_micro_batch
    from wharf.train.offpolicy import _logprobs
    from train_util import base, sample_rows
    from train_util import write_round as write_batches

    write_batches(tmp_path / "convert", sample_rows(4, 8, 1.0, 0), [1.0, -1.0, 1.0, -1.0], 1.0)
    files = sorted((tmp_path / "convert").glob("mb-*.safetensors"))
    model = base()[0]
    for f in files:
        mb = load_micro_batch(f)
        got, keep = _logprobs(model, mb), mb.completion_mask[:, 1:].numpy() > 0
        assert keep.sum() == 16 and (got[~keep] == 0).all()
        with torch.no_grad():
            z = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids).logits
        full = torch.log_softmax(z[:, :-1].float(), -1).gather(-1, mb.input_ids[:, 1:, None]).squeeze(-1).numpy()
        # float32 summation order alone (a logsumexp over 49,152 logits taken in other blocks): ~1e-5
        assert abs(got[keep] - full[keep]).max() < 5e-5 and abs(got[keep] - full[keep]).mean() < 2e-5
        assert abs(got[keep] - mb.old_logprobs[:, 1:].numpy()[keep]).max() < 1e-4  # on-policy samples


def test_a_step_a_few_tokens_outweighed_is_named(tmp_path):
    """The #34 anchor runs: a KL estimate of 6,942 gave a gradient norm of 137,376, which the clip
    turned into a step in those tokens' direction alone; every other check passed."""
    rnd = RunLayout(tmp_path / "run").round(0)
    write_round(rnd, "policy-v0", {"a": 1, "b": 3}, grad_norms=(0.67, 111.2, 1.3, 137375.75))
    bad = failed(check_round(rnd, "policy-v0", HealthConfig()))
    assert list(bad) == ["steps_stable"] and bad["steps_stable"].file == str(rnd.train.metrics)
    assert "largest 1.37e+05 (step 4, KL estimate 1.37e+03)" in bad["steps_stable"].seen
    assert "loop.health.max_grad_norm=0" in bad["steps_stable"].message()
    assert failed(check_round(rnd, "policy-v0", HealthConfig(max_grad_norm=0))) == {}
    assert failed(check_round(rnd, "policy-v0", HealthConfig(max_grad_norm=2e5))) == {}


def test_a_replica_that_refused_the_published_policy_is_named(tmp_path):
    from wharf.core.replicas import PublishRecord, ReplicaResult

    layout = RunLayout(tmp_path / "run")
    rnd = layout.round(1)
    write_round(rnd, "policy-v1", {"a": 1, "b": 3})
    PublishRecord("policy-v2", "adapter", [ReplicaResult("http://127.0.0.1:1", True),
                                           ReplicaResult("http://127.0.0.1:2", False, "HTTP 500: no")]
                  ).write(layout.published("policy-v2"))
    bad = failed(check_round(rnd, "policy-v1", HealthConfig()))
    assert list(bad) == ["replicas_serve"]
    msg = bad["replicas_serve"].message()
    assert "http://127.0.0.1:2 refused policy-v2 (HTTP 500: no)" in msg and "all_replicas_serve=false" in msg
    assert failed(check_round(rnd, "policy-v1", HealthConfig(all_replicas_serve=False))) == {}


def test_replicas_serve_asks_the_replicas_not_the_publish_record(tmp_path):
    """A replica that restarted after publish holds no policy-v2 although the record says it took
    it: the loop's check asks each replica (/v1/models) and names it; one that refused at publish
    but serves it now (reloaded before the round) passes."""
    from wharf.pipeline.loop import check_health
    from testing.vllm_stub import StubServer
    from wharf.core.endpoint import Endpoint
    from wharf.core.replicas import PublishRecord, ReplicaResult

    with StubServer(loras=True) as a, StubServer(loras=True) as b:
        cfg = load_config(None, [f"runs_dir={tmp_path}", "name=run", f"endpoint.url={a.url}", "round=1",
                                 f"proxy.upstreams=[{b.url}]", "endpoint.model=stub-model", "collect.policy=policy-v1"])
        rnd = cfg.layout.round(1)
        write_round(rnd, "policy-v1", {"a": 1, "b": 3})
        write_marker(rnd, "publish", 0.1, policy="policy-v2", published=True)
        PublishRecord("policy-v2", str(rnd.train.adapter), [ReplicaResult(a.url, True), ReplicaResult(b.url, True)]
                      ).write(cfg.layout.published("policy-v2"))
        a.stub.adapters["policy-v2"] = str(rnd.train.adapter)  # b restarted since: it lost policy-v2
        ep = Endpoint(a.url, model="stub-model")
        bad = failed(check_health(cfg, ep))
        assert list(bad) == ["replicas_serve"] and f"{b.url} refused policy-v2" in bad["replicas_serve"].seen
        assert "does not serve policy-v2 now" in bad["replicas_serve"].seen and a.url not in bad["replicas_serve"].seen
        assert failed(check_round(rnd, "policy-v1", HealthConfig())) == {}  # the record alone misses it
        PublishRecord("policy-v2", str(rnd.train.adapter), [ReplicaResult(a.url, True),
                                                             ReplicaResult(b.url, False, "HTTP 500")]
                      ).write(cfg.layout.published("policy-v2"))
        b.stub.adapters["policy-v2"] = str(rnd.train.adapter)  # reloaded on b since
        assert failed(check_health(cfg, ep)) == {}
