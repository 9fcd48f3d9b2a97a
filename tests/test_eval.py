"""`wharf eval`: policy specs resolve to the right weights, which the real engine serves (log-probs
differ from the base's); end to end, base and an adapter on a tiny held-out set through the real
engine, the minimal agent and harbor trials in bubblewrap."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, free_port
from wharf.core import model_store, schema
from wharf.core.config import load_config
from wharf.core.configio import ConfigError
from wharf.core.endpoint import Endpoint
from wharf.core.layout import RunLayout
from wharf.core.names import weights_digest
from wharf.pipeline.eval import EvalError, Policy, eval_name, resolve, served_digest, serving

MSGS = [{"role": "user", "content": "Name a colour."}]


def make_adapter(path: Path, seed: int) -> Path:
    """A saved peft adapter with random non-zero A and B: it changes the base's outputs."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base, _ = model_store.load_model(model_store.embedded_model_dir(), "cpu", "float32")
    get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                    init_lora_weights=False)).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    run = RunLayout(root / "runs" / "R")
    make_adapter(run.round(2).train.adapter, seed=1)  # policy-v3 of run R
    return make_adapter(root / "my-adapter", seed=2), run


def test_specs_resolve_to_their_weights_or_name_the_missing_path(adapters):
    adapter, run = adapters
    assert resolve("base") == Policy("base", "base", None, 0)
    assert resolve(f"{run.root}:0").adapter is None  # policy-v0 is the base model
    p = resolve(f"{run.root}:3")
    assert (p.adapter, p.round, p.label) == (run.round(2).train.adapter, 3, f"R-policy-v3-{p.sha256[:8]}")
    q = resolve(str(adapter))
    assert q.adapter == adapter and q.label == f"adapter-my-adapter-{q.digest[:6]}"
    assert p.served_name("m") != q.served_name("m") and p.served_name("m") == resolve(f"{run.root}:3").served_name("x")
    with pytest.raises(EvalError, match=f"{run.round(1).train.adapter}.*rounds on disk: \\[2\\]"):
        resolve(f"{run.root}:2")
    with pytest.raises(EvalError, match="nowhere.*no adapter_config.json"):
        resolve(str(adapter.parent / "nowhere"))


def test_bad_specs_and_names_are_refused_at_load():
    cfg = load_config(None, ["eval.dataset=datasets/multiturn/heldout"])
    assert eval_name(cfg) == "multiturn-heldout" and cfg.eval.policies == ["base"]
    with pytest.raises(ConfigError, match=r"eval.policies\[1\]: 'runs/R:x'.*base.*<run dir>:<k>.*adapter dir"):
        load_config(None, ["eval.policies=[base,runs/R:x]"])
    with pytest.raises(ConfigError, match="loop.eval_every=2 needs loop.eval_dataset"):
        load_config(None, ["loop.eval_every=2"])


def _logprobs(ep: Endpoint, model: str) -> tuple[list, list]:
    r = ep._json("POST", "/v1/chat/completions", {"model": model, "messages": MSGS, "max_tokens": 6, "seed": 0,
                                                  "temperature": 1.0, "logprobs": True, "return_token_ids": True})
    ch = r["choices"][0]
    return ch["token_ids"], [e["logprob"] for e in ch["logprobs"]["content"]]


def test_both_forms_are_served_with_their_own_weights(adapters, engine_url):
    adapter, run = adapters
    ep = Endpoint(engine_url, model="smollm2-135m")
    cfg = load_config(None, [f"endpoint.url={engine_url}"])
    base = _logprobs(ep, "smollm2-135m")
    seen = {}
    for spec in (str(adapter), f"{run.root}:3"):
        with serving(ep, cfg, resolve(spec)) as (name, refused):
            assert refused == []
            assert name in ep.models()
            seen[spec] = _logprobs(ep, name)
            # the same weights, the same seed: the same tokens; the log-probs within fp32 noise (the
            # second call reuses the first's prefix, so its last prompt token is computed in another pass)
            again = _logprobs(ep, name)
            assert again[0] == seen[spec][0] and max(abs(a - b) for a, b in zip(again[1], seen[spec][1])) < 1e-4
        assert name not in ep.models()  # unloaded after: the endpoint's adapter slots are few
    assert base != seen[str(adapter)] and base != seen[f"{run.root}:3"] and seen[str(adapter)] != seen[f"{run.root}:3"]


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
def test_eval_cli_base_and_adapter_end_to_end(adapters, engine_url, tmp_path):
    adapter, _ = adapters
    task = "datasets/learn/heldout/echo-color-1"
    cmd = [sys.executable, "-m", "wharf.pipeline.cli", "eval", "--config", str(REPO / "configs/learn.yaml"),
           f"runs_dir={tmp_path}", "name=t", f"eval.dataset={task}", f"eval.policies=[base,{adapter}]",
           "eval.attempts=2", f"endpoint.url={engine_url}", "endpoint.launch=false", f"proxy.port={free_port()}"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1400)
    assert out.returncode == 0, out.stderr[-3000:]
    ev = RunLayout(tmp_path / "t").eval("heldout-echo-color-1")
    summary = json.loads(ev.summary.read_text())
    label = resolve(str(adapter)).label
    assert summary["last"] == ["base", label] and summary["attempts"] == 2
    assert "NaN" not in ev.summary.read_text()  # one task: no interval, written as null
    assert "base: reward" in out.stdout and f"{adapter} - base:" in out.stdout and "pass@2" in out.stdout
    seeds = {}
    for label in summary["last"]:
        collect = ev.policy(label).round(0).collect
        rows = schema.read_table(collect.rollouts, "rollouts").to_pylist()
        assert sorted(r["attempt"] for r in rows) == [0, 1] and json.loads(collect.manifest.read_text())["state"] == "done"
        turns = schema.read_dir(collect.turns, "turns").to_pylist()
        seeds[label] = sorted((r["rollout_id"].split(".")[2], r["turn"], json.loads(r["sampling"])["seed"]) for r in turns
                              if r["turn"] == 0)
        served = {r["policy"] for r in turns}
        assert served == {"smollm2-135m"} if label == "base" else {served_digest(s) for s in served} == {
            Policy("", "", adapter).digest}
    assert seeds["base"] == seeds[label]  # the same seed for the same (task, attempt): paired
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)  # finished: nothing re-run
    assert again.returncode == 0 and again.stdout.splitlines()[1] == out.stdout.splitlines()[1]


def test_summary_json_and_printed_figures(tmp_path):
    from wharf.pipeline.eval import summary_lines, write_summary
    from wharf.pipeline.eval_stats import Trial

    cfg = load_config(None, [f"runs_dir={tmp_path}", "eval.dataset=datasets/learn/heldout", "eval.attempts=2"])
    ev = cfg.layout.eval(eval_name(cfg))
    base = [Trial("a", 0, 0.0), Trial("a", 1, 1.0), Trial("b", 0, 0.0), Trial("b", 1, 0.0)]
    new = [Trial("a", 0, 1.0), Trial("a", 1, 1.0), Trial("b", 0, 1.0), Trial("b", 1, 0.0)]
    s = write_summary(ev, cfg, {"base": (Policy("base", "base", None, 0), base, ev.policy("base")),
                                "x": (Policy("runs/R:2", "x", tmp_path, 2), new, ev.policy("x"))})
    assert json.loads(ev.summary.read_text()) == s and ev.root.name == "learn-heldout"
    assert s["policies"]["x"]["pass_at"] == {"1": 0.75, "2": 1.0} and s["policies"]["x"]["successes"]["b"] == [1, 2]
    d = s["paired"]["x - base"]
    assert (d["mean"], d["pairs"], d["tasks"]) == (0.5, 4, 2) and d["low"] == pytest.approx(0.5)  # +0.5 on each task
    lines = summary_lines(s)
    assert "base: reward 0.250 [-2.927, 3.427] over 4 trials; pass@1 0.250, pass@2 0.500" in lines[1]  # a: 1 of 2, b: 0 of 2
    assert lines[4] == "    successes: a 2/2 b 1/2" and "runs/R:2 - base: 0.500 [0.500, 0.500]" in lines[5]


def test_trials_left_out_are_counted_in_the_summary_and_its_lines(tmp_path):
    from test_report import _rollouts
    from wharf.pipeline.eval import read_trials, summary_lines, write_summary

    cfg = load_config(None, [f"runs_dir={tmp_path}", "eval.dataset=datasets/learn/heldout", "eval.attempts=4"])
    ev = cfg.layout.eval(eval_name(cfg))
    rows = _rollouts(0, {"a": 2, "b": 1})
    for r, status in zip(rows, ["infra_error", "infra_error", "verifier_error"]):
        r["status"], r["reward"] = status, None
    rows[0]["n_errors"], rows[1]["n_errors"] = 3, 2  # the replica lost the policy: every later call a 404
    schema.write_table(ev.policy("base").round(0).collect.rollouts, "rollouts", rows)
    trials = read_trials(ev.policy("base"), 4)
    s = write_summary(ev, cfg, {"base": (Policy("base", "base", None, 0), trials, ev.policy("base"))})
    assert len(trials) == len(rows) - 3 and s["policies"]["base"]["unscored"] == {"infra_error": 2, "verifier_error": 1}
    assert s["policies"]["base"]["upstream_errors"] == 5
    assert (f"over {len(rows) - 3} trials (3 left out: infra_error 2, verifier_error 1); 5 upstream call errors;"
            in summary_lines(s)[1])


def _loop_eval_job(run: RunLayout, k: int, successes: dict[str, int], **manifest) -> Path:
    """What a loop with loop.eval_every leaves for policy-v<k> of `run`: a finished collect job
    under runs/<run>/evals/learn-heldout/<run>-policy-v<k>/ (rewards: successes of 4 attempts per task)."""
    return _eval_job(run.evals / "learn-heldout" / f"{run.root.name}-policy-v{k}", run.round(k - 1).train.adapter,
                     successes, **manifest)


def _eval_job(folder: Path, adapter: Path, successes: dict[str, int], **manifest) -> Path:
    """A finished eval job of `adapter`'s weights in `folder` (its manifest names the weights as
    eval's served name does: eval-<sha256 prefix>)."""
    from test_report import _rollouts

    job = RunLayout(folder).round(0).collect
    schema.write_table(job.rollouts, "rollouts", _rollouts(0, successes))
    job.manifest.write_text(json.dumps({
        "state": "done", "policy": f"eval-{weights_digest(adapter)[:12]}", "dataset": "datasets/learn/heldout", "attempts": 4, "agent": "wharf.collect.agents.minimal:MinimalAgent",
        "environment": "wharf.collect.sandbox.bwrap:BwrapEnvironment",
        "sampling": {"temperature": 0.7, "top_p": 1.0, "seed": 3}, **manifest}))
    return job.root


def test_policies_their_loops_evaluated_are_read_not_run_again(tmp_path, capsys):
    """GRPO vs its control at round 2, both evaluated by their own loops with the same trials: the
    paired difference comes from the stored jobs, with no endpoint (nothing answers at its URL)."""
    from wharf.pipeline.eval import main

    runs = {}
    for name, ok in (("grpo", {"a": 4, "b": 3}), ("zero", {"a": 1, "b": 0})):
        run = RunLayout(tmp_path / name)
        make_adapter(run.round(1).train.adapter, seed=len(name))
        runs[name] = (run, _loop_eval_job(run, 2, ok))
    args = ["--config", str(REPO / "configs/learn.yaml"), f"runs_dir={tmp_path}", "name=cmp",
            "eval.dataset=datasets/learn/heldout", "eval.attempts=4", "sampling.seed=3", "endpoint.launch=false",
            f"endpoint.url=http://127.0.0.1:{free_port()}",
            f"eval.policies=[{runs['zero'][0].root}:2,{runs['grpo'][0].root}:2]"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "reward 0.125 [-1.463, 1.713] over 8 trials" in out  # zero: a 1/4, b 0/4
    assert f"{runs['grpo'][0].root}:2 - {runs['zero'][0].root}:2: 0.750 [0.750, 0.750] (paired by task and attempt, 8 pairs)" in out
    summary = json.loads((tmp_path / "cmp/evals/learn-heldout/summary.json").read_text())
    assert {e["collect"] for e in summary["policies"].values()} == {str(j) for _, j in runs.values()}
    assert not (tmp_path / "cmp/evals/learn-heldout/grpo-policy-v2").exists()  # no trial of its own

    # other trials (another seed) are not the same trials: run, so an endpoint is needed
    _loop_eval_job(runs["grpo"][0], 2, {"a": 4, "b": 3}, sampling={"temperature": 0.7, "top_p": 1.0, "seed": 4})
    assert main([*args[:-1], "name=cmp2", f"eval.policies=[{runs['grpo'][0].root}:2]"]) == 1
    assert "nothing answers" in capsys.readouterr().err


def test_stored_trials_are_read_only_for_the_same_weights(tmp_path, capsys):
    """expA/seed1 and expB/seed1: one label scheme (seed1-policy-v2), other weights. An eval holding
    expA's trials (its own job, as an eval from before weight-keyed labels left it) reads expB's
    own loop job for expB, never expA's; with no job of expB's weights anywhere it must sample."""
    from wharf.pipeline.eval import main

    a, b = RunLayout(tmp_path / "expA" / "seed1"), RunLayout(tmp_path / "expB" / "seed1")
    make_adapter(a.round(1).train.adapter, seed=5)
    make_adapter(b.round(1).train.adapter, seed=6)
    own = tmp_path / "cmp/evals/learn-heldout/seed1-policy-v2"
    _eval_job(own, a.round(1).train.adapter, {"a": 4, "b": 4})  # expA's trials: reward 1.0
    args = ["--config", str(REPO / "configs/learn.yaml"), f"runs_dir={tmp_path}", "name=cmp",
            "eval.dataset=datasets/learn/heldout", "eval.attempts=4", "sampling.seed=3", "endpoint.launch=false",
            f"endpoint.url=http://127.0.0.1:{free_port()}"]
    assert main([*args, f"eval.policies=[{b.root}:2]"]) == 1  # nothing of expB's weights: to be sampled
    assert "nothing answers" in capsys.readouterr().err
    b_job = _loop_eval_job(b, 2, {"a": 1, "b": 0})
    assert main([*args, f"eval.policies=[{b.root}:2]"]) == 0
    assert "reward 0.125" in capsys.readouterr().out  # expB's: a 1/4, b 0/4
    entry = json.loads((tmp_path / "cmp/evals/learn-heldout/summary.json").read_text())["policies"]
    label = resolve(f"{b.root}:2").label
    assert entry[label]["collect"] == str(b_job) and entry[label]["sha256"] == weights_digest(b.round(1).train.adapter)
    assert main([*args, f"eval.policies=[{a.root}:2]"]) == 0  # expA's own stored job is still read for expA
    assert "reward 1.000" in capsys.readouterr().out
