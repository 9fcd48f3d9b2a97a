"""Atomic training checkpoints: LoRA weights, optimizer, scheduler, RNG and the step.

Each checkpoint is written into a fresh `step-<n>` dir under a temporary name, renamed into
place, and only then named by the `latest` file (replaced atomically), so a SIGKILL at any
moment leaves either the previous checkpoint or the new one, never half of one.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def save(root: Path, step: int, lora: dict, optimizer: dict, scheduler: dict, meta: dict) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    tmp = root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({k: v.contiguous().cpu() for k, v in lora.items()}, str(tmp / "lora.safetensors"))
    torch.save({"optimizer": optimizer, "scheduler": scheduler, "rng": _rng_state()}, tmp / "state.pt")
    (tmp / "meta.json").write_text(json.dumps({**meta, "step": step}, indent=1))
    final = root / name
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    latest_tmp = root / "latest.tmp"
    latest_tmp.write_text(name)
    os.replace(latest_tmp, root / "latest")
    for old in root.iterdir():  # earlier checkpoints and leftovers of a killed save
        if old.name not in (name, "latest") and (old.name.startswith("step-") or old.name.startswith(".step-")):
            shutil.rmtree(old, ignore_errors=True)
    return final


def load(root: Path) -> dict | None:
    """{'lora', 'optimizer', 'scheduler', 'meta'} of the latest checkpoint (RNG restored), or None."""
    latest = root / "latest"
    if not latest.is_file():
        return None
    d = root / latest.read_text().strip()
    state = torch.load(d / "state.pt", weights_only=False)
    _set_rng_state(state["rng"])
    return {"lora": load_file(str(d / "lora.safetensors")), "optimizer": state["optimizer"],
            "scheduler": state["scheduler"], "meta": json.loads((d / "meta.json").read_text())}


def _rng_state() -> dict:
    out = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def _set_rng_state(s: dict) -> None:
    random.setstate(s["python"])
    torch.set_rng_state(s["torch"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])
