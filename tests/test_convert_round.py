"""A round collected by the real proxy against the local engine with the multi-turn minimal agent
converts: merged rows where the chat template keeps the prefix, split rows where it does not, and
the masked-in ids of every row decode to the assistant texts of that rollout's calls."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from collect.agents.logs import read_agent_log
from wharf.config import load_config
from wharf.model_store import resolve_model_dir
from wharf.layout import CollectPaths
from conftest import free_port
from wharf.batches import load_micro_batch, read_index
from convert.stage import convert_round

REPO = Path(__file__).resolve().parents[1]


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


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
def test_collected_round_converts_token_exact(tmp_path):
    port = free_port()
    args = ["--config", str(REPO / "configs/default.yaml"), f"runs_dir={tmp_path}", "name=r",
            f"engine.port={port}", f"endpoint.url=http://127.0.0.1:{port}", f"proxy.port={free_port()}",
            "collect.tasks=[sed-add,write-answer,write-hello]", "collect.attempts=2"]
    out = subprocess.run([sys.executable, "-m", "collect", *args], cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    # every completion trained, cut ones too: each row's mask must cover all its calls' texts
    cfg = load_config(REPO / "configs/default.yaml", [*args[2:], "convert.length_completions=keep"])
    stats = convert_round(cfg, progress=False)
    assert stats["rollouts"]["read"] == 6 and stats["rollouts"]["used"] >= 2, stats["rollouts"]
    # the minimal agent's history mostly keeps the prefix (merged rows) but re-tokenizes some
    # completions (prefix breaks: split rows), and stats.json shows both
    assert stats["rows"]["merged"] > 0 and stats["rows"]["split_rollouts"] > 0, stats["rows"]
    assert stats["prefix_breaks"]["total"] > 0 and stats["prefix_breaks"]["by_agent"]
    b = next(iter(stats["prefix_breaks"]["by_rollout"].values()))[0]
    assert b["row_ids"] != b["prompt_ids"] and b["position"] >= b["from"]
    tok = AutoTokenizer.from_pretrained(resolve_model_dir(None))
    assert check_decodes(cfg.round_dir() / "convert", tok) >= stats["rows"]["count"]
