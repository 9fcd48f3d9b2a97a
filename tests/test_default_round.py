"""The main job, as `make collect` runs it on the embedded default: collect starts the local
engine and the proxy itself, runs toy tasks x 4 attempts in bubblewrap with MinimalAgent, and
must leave groups GRPO can learn from. Half of the 10 tasks (the three with mixed groups at seed 0
and two without), so that it costs half of `make demo`'s CPU: it was the suite's longest test.
Minutes long; CI runs it once, and every test here reads that one round (read-only: convert
writes into a run dir of its own).

The convert check: a round collected by the real proxy against the local engine with the
multi-turn minimal agent converts: merged rows where the chat template keeps the prefix, split
rows where it does not, and the masked-in ids of every row decode to the assistant texts of that
rollout's calls."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from wharf.core import schema
from wharf.collect.agents.logs import read_agent_log
from wharf.collect.audit import audit_round
from wharf.convert.stage import convert_round
from wharf.core.batches import load_micro_batch, read_index
from wharf.core.config import load_config
from wharf.core.layout import CollectPaths
from wharf.core.model_store import resolve_model_dir
from conftest import free_port

REPO = Path(__file__).resolve().parents[1]
TASKS = ("sed-add", "sed-greeting", "write-answer", "write-hello", "fix-is-even")
TRIALS = 4 * len(TASKS)  # configs/default.yaml's 4 attempts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800),  # the round may take up to its subprocess timeout
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")]


@pytest.fixture(scope="module")
def default_round(tmp_path_factory) -> Path:
    """The collect dir of one `python -m wharf.collect` on configs/default.yaml, run once for this module."""
    runs = tmp_path_factory.mktemp("default-round")
    port = free_port()
    cmd = [sys.executable, "-m", "wharf.collect", "--config", str(REPO / "configs/default.yaml"), f"runs_dir={runs}",
           f"collect.tasks=[{','.join(TASKS)}]",
           f"engine.port={port}", f"endpoint.url=http://127.0.0.1:{port}", f"proxy.port={free_port()}"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    return runs / "default/rounds/0/collect"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model_dir(None))


def test_default_round_has_learning_signal(default_round, tokenizer):
    manifest = json.loads((default_round / "manifest.json").read_text())
    rollouts = schema.read_table(default_round / "rollouts.parquet", "rollouts").to_pylist()
    assert len(rollouts) == TRIALS and manifest["counts"]["by_status"] == {"ok": TRIALS}, manifest["counts"]
    # GRPO learns only from groups with both a success and a failure
    assert len(manifest["mixed_groups"]) >= 2, manifest["success_rate_by_task"]
    # A gross-regression guard: all 10 tasks took 12.6 min at 8 trials at once beside other work
    # (25 min in CI at 2 at once, where this guard, then at 24 min, caught it); here half of them.
    assert manifest["wall_s"] < 15 * 60, manifest["wall_s"]
    # The 4 attempts of a task share their first prompt: the engine's prefix cache reuses it.
    pc = manifest["prefix_cache"]
    assert 0 < pc["cached_tokens"] < pc["prompt_tokens"] and pc["hit_rate"] > 0.3, pc
    report = audit_round(default_round, lambda ids: tokenizer.decode(ids), tokenizer.eos_token)
    assert report.checked == TRIALS and report.ok, report.problems


def spans(ids: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    """The runs of mask 1: one per generated completion."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return [ids[a:b] for a, b in zip(edges[::2], edges[1::2])]


def check_decodes(convert_dir: Path, tok) -> int:
    """Every row's completions decode to the agent's own texts of the calls the row holds."""
    index = read_index(convert_dir)
    got: dict[int, list] = {}
    for f in index.files:
        mb = load_micro_batch(convert_dir / f.file)
        for i in range(mb.shape[0]):
            # a completion ends with the end-of-turn token the agent never sees (unless cut by max_tokens)
            texts = [tok.decode(s).removesuffix(tok.eos_token)
                     for s in spans(mb.input_ids[i].numpy(), mb.completion_mask[i].numpy())]
            got.setdefault(int(mb.rollout_index[i]), []).append(texts)
    checked = 0
    for ri, r in enumerate(index.rollouts):
        trial = CollectPaths(Path(r["dir"])).trial(r["rollout_id"])
        agent = [c.text for c in read_agent_log(trial / "agent").calls]  # the agent's own record
        want = [[agent[t] for t in turns] for turns in r["row_turns"]]
        assert sorted(got[ri]) == sorted(want), r["rollout_id"]
        checked += sum(len(w) for w in want)
    return checked


def test_collected_round_converts_token_exact(default_round, tokenizer, tmp_path):
    # every completion trained, cut ones too: each row's mask must cover all its calls' texts
    cfg = load_config(REPO / "configs/default.yaml", [f"runs_dir={tmp_path}", "name=r",
                                                      f"convert.jobs=[{default_round}]", "convert.length_completions=keep"])
    stats = convert_round(cfg, progress=False)
    assert stats["rollouts"]["read"] == TRIALS and stats["rollouts"]["used"] >= 2, stats["rollouts"]
    # the minimal agent's history mostly keeps the prefix (merged rows) but re-tokenizes some
    # completions (prefix breaks: split rows), and stats.json shows both
    assert stats["rows"]["merged"] > 0 and stats["rows"]["split_rollouts"] > 0, stats["rows"]
    assert stats["prefix_breaks"]["total"] > 0 and stats["prefix_breaks"]["by_agent"]
    b = next(iter(stats["prefix_breaks"]["by_rollout"].values()))[0]
    assert b["row_ids"] != b["prompt_ids"] and b["position"] >= b["from"]
    assert check_decodes(cfg.round_dir() / "convert", tokenizer) >= stats["rows"]["count"]
