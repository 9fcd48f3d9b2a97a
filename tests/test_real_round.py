"""Real-repository tasks through a real agent (docs/tasks-factory.md): `wharf tasks make` makes two
bug-fix tasks from the bundled tinycalc sdist (offline, as tests/factory_kit.py does), an
unmodified mini-swe-agent works on each in the bubblewrap sandbox against the local engine
(SmolLM2-135M), the pytest judge grades each trial in the package's env, and the round converts
to rows and trains one step into a LoRA adapter. A trial that ends in an infra or verifier error
fails the test: that is a bug in the task dirs, the sandbox's binds, the agent's install or the judge."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, free_port
from tests.factory_kit import FIXTURE, offline_env, put_sdist
from wharf.convert.stage import convert_round
from wharf.core import schema
from wharf.core.batches import load_micro_batch, read_index
from wharf.core.config import load_config
from wharf.tasks.factory import cli
from wharf.tasks.factory.package import Package
from wharf.tasks.factory.taskdir import task_id
from wharf.train.stage import train_round

CONFIG = REPO / "configs" / "real.yaml"


def test_the_sample_names_tasks_that_passed_the_check_under_todays_judge():
    """make real makes only those (--checked-only): a sample task without a pass would be missing."""
    from wharf.tasks.factory.verify import checked_bugs, judge_digest

    passed = set()
    for path in (REPO / "datasets" / "real" / "manifests").glob("*.json"):
        m = json.loads(path.read_text())
        pkg = Package(m["package"], m["version"], Path("."), m["pyroot"], m["test_paths"])
        passed |= {task_id(pkg, bug) for bug in checked_bugs(m, judge_digest())}
    sample = load_config(CONFIG).collect.tasks
    assert len(sample) == 8 and set(sample) <= passed, sorted(set(sample) - passed)


def test_make_real_makes_the_set_then_collects_converts_and_trains_the_sample():
    out = subprocess.run(["make", "-n", "--no-print-directory", "real", "TASKS_OUT=somewhere"], cwd=REPO,
                         capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "MAKEFLAGS": ""})
    assert out.returncode == 0, out.stderr
    lines = [shlex.split(line[line.index("bin/wharf "):]) for line in out.stdout.splitlines() if "bin/wharf " in line]
    assert [w[1] for w in lines] == ["tasks", "collect", "convert", "train"]
    assert lines[0][lines[0].index("--out") + 1] == "somewhere" and "--checked-only" in lines[0]
    cfgs = {w[1]: load_config(REPO / w[3], [a for a in w[4:] if "=" in a]) for w in lines[1:]}
    assert cfgs["collect"].collect.dataset == "somewhere" and cfgs["collect"].collect.tasks
    assert "mini_swe" in cfgs["collect"].collect.agent and cfgs["collect"].engine.max_model_len == 8192
    for stage in ("convert", "train"):  # every reward is 0 with SmolLM2: one supervised step
        assert cfgs[stage].convert.mode == "sft" and cfgs[stage].train.objective == "sft"


needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


def make_tasks(tmp_path: Path, cache: Path) -> list[Path]:
    """Two tasks, their sdist and env in a cache of their own (the model stays in the usual one)."""
    put_sdist(cache, FIXTURE, "tinycalc")
    offline_env(cache, "tinycalc-0.1")
    out = tmp_path / "tasks"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WHARF_CACHE", str(cache))
        assert cli.main(["tinycalc==0.1", "--out", str(out), "--max", "2", "--seed", "1", "--no-check"]) == 0
    return sorted(p for p in out.iterdir() if (p / "task.toml").is_file())


def collect(tmp_path: Path, cache: Path, tasks: Path, engine_url: str) -> subprocess.CompletedProcess:
    """configs/real.yaml's round on the made tasks: one call a trial and a short answer (a train row
    is still ~1k tokens of mini's prompt); the collect sees the tasks' cache (its envs are what the
    sandbox shows the judge)."""
    cmd = [sys.executable, "-m", "wharf.collect", "--config", str(CONFIG), f"runs_dir={tmp_path}", "name=t",
           f"collect.dataset={tasks}", "collect.tasks=[]", "collect.attempts=1",
           "collect.agent_kwargs={step_limit: 1}", "sampling.max_tokens=48",
           f"endpoint.url={engine_url}", "endpoint.launch=false", f"proxy.port={free_port()}"]
    env = {**os.environ, "WHARF_CACHE": str(cache)}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@needs_bwrap
def test_mini_swe_agent_round_on_made_tasks_is_judged_then_trains(tmp_path, engine_url):
    cache = tmp_path / "cache"
    made = make_tasks(tmp_path, cache)
    assert len(made) == 2
    r = collect(tmp_path, cache, tmp_path / "tasks", engine_url)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    cdir = tmp_path / "t" / "rounds" / "0" / "collect"
    rollouts = schema.read_table(cdir / "rollouts.parquet", "rollouts").to_pylist()
    assert sorted(ro["task_id"] for ro in rollouts) == [p.name for p in made]
    for ro in rollouts:  # ok: the agent ran and the judge decided; no infra_error or verifier_error
        assert ro["status"] == "ok" and ro["n_turns"] >= 1, (ro["status"], ro["error"])
        verdict = json.loads(ro["rewards"])
        spec = json.loads((tmp_path / "tasks" / ro["task_id"] / "tests" / "spec.json").read_text())
        # the judge's own verdict, recorded: the spec's tests ran in the package's env, sealed and confined
        assert verdict["f2p_total"] == len(spec["FAIL_TO_PASS"]) and verdict["p2p_total"] == len(spec["PASS_TO_PASS"])
        assert verdict["records_ok"] == 1 and verdict["sealed"] == 1 and verdict["grader_pytest_report"] == 1
        assert ro["reward"] == verdict["reward"] == float(verdict["resolved"])
    # Every reward is 0 (SmolLM2 does not fix the bug): GRPO would find no group with signal, so the
    # round's own rollouts train one supervised step (the path rows -> masks -> adapter, not learning).
    # (length_completions=keep: at 48 tokens most answers are cut, and masked they would leave no rows)
    cfg = load_config(CONFIG, [f"runs_dir={tmp_path}", "name=t", "convert.mode=sft", "convert.sft.min_reward=0",
                               "convert.length_completions=keep", "train.objective=sft", "train.publish=false",
                               "train.grad_checkpointing=false"])
    stats = convert_round(cfg, progress=False)
    index = read_index(tmp_path / "t" / "rounds" / "0" / "convert")
    assert stats["rollouts"]["used"] == len(rollouts) and index.n_rows == stats["rows"]["count"] >= len(rollouts)
    for f in index.files:
        mb = load_micro_batch(tmp_path / "t" / "rounds" / "0" / "convert" / f.file)
        assert int(mb.completion_mask.sum()) == f.loss_tokens > 0  # the agent's answers only
        assert int(mb.completion_mask.sum()) < int(mb.attention_mask.sum())  # its prompts are context
    result = train_round(cfg, progress=False)
    assert result.steps == 1 and result.loss_tokens == index.loss_tokens
    assert (Path(result.adapter) / "adapter_model.safetensors").is_file()
