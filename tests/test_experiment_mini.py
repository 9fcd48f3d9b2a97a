"""`make experiment-mini` and `make mini-sft`, wired but not run (the experiment takes hours on 2
cores): each command the Makefile would run loads as a valid config, the arms differ only where
they should, and the SFT adapter the loop starts from is the one `make mini-sft` trains, from the
demonstrations its collect writes."""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from wharf.core.config import load_config
from wharf.core.layout import RunLayout, init_adapter_dir

REPO = Path(__file__).resolve().parents[1]


def wharf_commands(*make_args: str) -> dict[str, list]:
    """{wharf command: its config} of what `make -n` would run (continuation lines joined)."""
    out = subprocess.run(["make", "-n", "--no-print-directory", *make_args], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "MAKEFLAGS": ""})
    assert out.returncode == 0, out.stderr
    text = out.stdout.replace("\\\n", " ")
    got = {}
    for part in text.replace("&&", "\n").splitlines():
        if "bin/wharf " in part:
            words = shlex.split(part[part.index("bin/wharf "):])
            cmd, config, overrides = words[1], words[3], [w for w in words[4:] if "=" in w]
            got[cmd] = [load_config(REPO / config, overrides), overrides]
    return got


@pytest.mark.parametrize("arm, advantage, init", [("base", "grpo", None), ("sft", "zero", "runs/mini-sft-s7:1"),
                                                   ("sft-grpo", "grpo", "runs/mini-sft-s7:1")])
def test_each_arm_is_a_loop_of_mini_with_held_out_eval(arm, advantage, init):
    cmds = wharf_commands("experiment-mini", f"ARM={arm}", "SEED=7")
    assert sorted(cmds) == (["loop"] if arm == "base" else ["collect", "convert", "loop", "train"])  # sft arms: mini-sft first
    cfg = cmds["loop"][0]
    assert cfg.name == f"mini-{arm}-s7" and cfg.collect.agent == "wharf.collect.agents.mini_swe:LocalMiniSweAgent"
    assert cfg.sampling.seed == cfg.train.seed == 7 and cfg.convert.advantage == advantage
    assert cfg.loop.init_adapter == init and cfg.loop.eval_every == 5 and cfg.loop.eval_dataset == "datasets/multiturn/heldout"
    # 4 calls of 200 tokens bound a trial; the wall-clock limit must not be what a slow host trips
    assert cfg.collect.agent_timeout_s >= 1800 and cfg.collect.agent_kwargs["step_limit"] == 4


def test_mini_sft_trains_the_adapter_the_arms_start_from():
    cmds = wharf_commands("mini-sft", "SEED=7")
    collect, convert, train = cmds["collect"][0], cmds["convert"][0], cmds["train"][0]
    assert collect.proxy.text_only and collect.endpoint.model == "expert" and not collect.endpoint.launch
    assert convert.convert.mode == "sft" and train.train.objective == "sft"
    assert [Path(j) for j in convert.convert.jobs] == [RunLayout.of(collect.runs_dir, collect.name).round(0).collect.root]
    trained = RunLayout.of(train.runs_dir, train.name).round(0).train.adapter
    assert init_adapter_dir("runs/mini-sft-s7:1") == trained and convert.name == train.name


def test_an_unknown_arm_is_refused():
    out = subprocess.run(["make", "-n", "experiment-mini", "ARM=dpo"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "use ARM=base, sft or sft-grpo" in out.stderr


def test_a_second_seed_at_once_gives_its_demonstrations_its_own_proxy_port():
    """Two seeds side by side: mini-sft's collect takes proxy.port from ARGS (the loop's engine
    and endpoint ports are the loop's alone), so it never meets the other seed's proxy."""
    args = "ARGS=engine.port=8120 endpoint.url=http://127.0.0.1:8120 proxy.port=8220"
    cmds = wharf_commands("experiment-mini", "ARM=sft-grpo", "SEED=7", "MINI_EXPERT_PORT=8320", args)
    collect, looped = cmds["collect"][0], cmds["loop"][0]
    assert collect.proxy.port == looped.proxy.port == 8220 and collect.endpoint.url == "http://127.0.0.1:8320"
    assert looped.engine.port == 8120 and looped.endpoint.url == "http://127.0.0.1:8120"


def test_the_table_target_reads_the_design_s_runs():
    out = subprocess.run(["make", "-n", "--no-print-directory", "experiment-mini-table", "DESIGN=split"], cwd=REPO,
                         capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "MAKEFLAGS": ""})
    assert out.returncode == 0 and "report --table" in out.stdout, out.stderr
