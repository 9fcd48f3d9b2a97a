"""How far off-policy each stored job is for the policy about to train on it (replay).

For every loss token: d = log pi_train(token) - log pi_behaviour(token), with pi_train the
policy the replay starts from (the base model, or an adapter) and pi_behaviour the endpoint's
stored processed log-prob. Per job: mean and max |d| (the mismatch the trainer's correction
has to absorb), the importance ratio exp(d) (mean, p95) and the k3 estimate of
KL(pi_behaviour || pi_train). Data sampled by the base model itself gives |d| ~ 0; data from a
later round's adapter does not. Written to rounds/<k>/train/offpolicy.json; the report shows it.
"""
from __future__ import annotations

import gc
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wharf.core import atomic
from wharf.core.batches import load_micro_batch, read_index
from wharf.core.layout import CollectPaths
from wharf.core.model_store import load_model


@dataclass
class JobAcc:
    """Per-token differences of one job, accumulated batch by batch (pure: no torch, no I/O)."""

    name: str
    dir: str
    policies: set = field(default_factory=set)
    diffs: list[np.ndarray] = field(default_factory=list)

    def add(self, d: np.ndarray) -> None:
        self.diffs.append(np.asarray(d, np.float64).ravel())

    def summary(self) -> dict:
        d = np.concatenate(self.diffs) if self.diffs else np.zeros(0)
        out = {"name": self.name, "dir": self.dir, "policies": ", ".join(sorted(self.policies)), "tokens": int(d.size)}
        if d.size:
            r = np.exp(np.clip(d, -20, 20))
            out.update(mismatch_mean=float(np.abs(d).mean()), mismatch_max=float(np.abs(d).max()),
                       ratio_mean=float(r.mean()), ratio_p95=float(np.quantile(r, 0.95)),
                       ratio_p05=float(np.quantile(r, 0.05)), kl=float((r - 1 - d).mean()))
        return out


def job_names(dirs: list[str]) -> dict[str, str]:
    """Short unique labels for job dirs: '<run>/r<k>' for runs/<run>/rounds/<k>/collect."""
    out = {}
    for d in dirs:
        p = Path(d)
        label = f"{p.parents[2].name}/r{p.parent.name}" if p.name == "collect" and len(p.parents) > 2 else p.name
        while label in out.values():
            label += "'"
        out[d] = label
    return out


def row_diffs(logp, behaviour, mask) -> list[np.ndarray]:
    """Per row, d at its loss tokens; all three [B, S] aligned (records.py's shift applied)."""
    keep = mask > 0
    return [(logp[b] - behaviour[b])[keep[b]] for b in range(logp.shape[0])]


def _logprobs(model, mb):
    """[B, T-1] log-probs of input_ids[:, 1:] under `model` (a causal LM or a peft model of one, its
    adapters as set), temperature applied, at the loss tokens only (0 elsewhere, where nothing
    reads them); one row at a time, and none for a row without loss tokens."""
    import torch

    from .model import head_scale, token_logprobs

    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    scale = head_scale(causal_lm.config)
    keep = mb.completion_mask[:, 1:] > 0
    out = torch.zeros(keep.shape, dtype=torch.float32)
    with torch.no_grad():
        for b in range(mb.input_ids.shape[0]):
            n = int(mb.attention_mask[b].sum())
            if not keep[b, :n - 1].any():
                continue
            lp, _ = token_logprobs(causal_lm, mb.input_ids[b:b + 1, :n], mb.attention_mask[b:b + 1, :n],
                                   mb.position_ids[b:b + 1, :n], mb.temperatures[b:b + 1] / scale, 1024,
                                   keep[b:b + 1, :n - 1])
            out[b, :n - 1] = lp[0]
    return out.numpy()


def compute(convert_dir: Path, model) -> list[dict]:
    """Per-job statistics for the micro-batches in `convert_dir` under `model` (eval mode)."""
    index = read_index(convert_dir)
    names = job_names(index.jobs)
    accs: dict[str, JobAcc] = {}
    by_id = {}
    for r in index.rollouts:  # rollouts carry their job id and dir (convert's index)
        d = r.get("dir") or r.get("job", "?")
        by_id.setdefault(r.get("job"), d)
    for f in index.files:
        mb = load_micro_batch(Path(convert_dir) / f.file)
        logp = _logprobs(model, mb)
        diffs = row_diffs(logp, mb.old_logprobs[:, 1:].numpy(), mb.completion_mask[:, 1:].numpy())
        for b, d in enumerate(diffs):
            ro = index.rollouts[int(mb.rollout_index[b])]
            job_dir = ro.get("dir") or by_id.get(ro.get("job"), "?")
            acc = accs.setdefault(job_dir, JobAcc(names.get(job_dir, Path(job_dir).name), job_dir))
            if ro.get("policy"):
                acc.policies.add(ro["policy"])
            acc.add(d)
    return [accs[d].summary() for d in sorted(accs, key=lambda d: list(names).index(d) if d in names else 1e9)]


def _job_policies(job_dir: str) -> set[str]:
    try:
        return {json.loads(CollectPaths(Path(job_dir)).manifest.read_text()).get("policy") or "?"}
    except (OSError, ValueError):
        return set()


def write(convert_dir: Path, out: Path, model_dir: Path, device: str = "cpu", adapter: Path | None = None) -> list[dict]:
    """Load the starting policy, compute per-job statistics, write them atomically to `out`."""
    model, _ = load_model(model_dir, device, "float32")
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter)).eval()
    jobs = compute(convert_dir, model)
    del model  # the trainer loads its own copy next, in this process
    gc.collect()
    for j in jobs:
        j["policies"] = j["policies"] or ", ".join(sorted(_job_policies(j["dir"])))
    atomic.write_json(out, {"start_policy": str(adapter) if adapter else "base model", "jobs": jobs})
    return jobs
