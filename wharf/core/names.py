"""What a run's adapters are called on a fleet, and what tells two adapters' weights apart.

A replica's LoRA names are one namespace shared by every run that samples from it, so a run's
policies carry the run in their name: `<run>-<h>-policy-v<k>`, where `<h>` is a hash of where the
run lives (its URL in object storage, else its real path; two runs named `seed1` under `expA/` and
`expB/` differ by it, and a run resumed on another machine keeps it). Runs stored before these
names sampled `policy-v<k>`; those names still read as the run's versions (policy_version).

An adapter's identity is the sha256 of its weights file, not its name or its dir: a round trained
again writes other weights into the same dir.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from wharf.core import storage

def run_tag(root: str | Path) -> str:
    """The prefix of a run's policy names: its dir name (what vLLM and an OpenAI `model` field take:
    letters, digits, `.`, `_`, `-`) and 8 hex of where it lives."""
    where = storage.url_of(root) or os.path.realpath(root)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(root).name).strip("-.")[:40] or "run"
    return f"{slug}-{hashlib.sha256(where.encode()).hexdigest()[:8]}"


def policy_name(k: int, tag: str | None = None) -> str:
    """The adapter trained on round k-1's data, which samples round k: `<tag>-policy-v<k>`
    (`policy-v<k>` with no tag: the name before per-run names)."""
    return f"{tag}-policy-v{k}" if tag else f"policy-v{k}"


def policy_version(name: str | None, base: str | None = None, tag: str | None = None) -> int | None:
    """k of a policy name (policy_name's inverse: `<tag>-policy-v<k>`, or `policy-v<k>` from before
    per-run names); 0 for the base model's name `base`; None for any other name. With `tag`, only
    that run's names count (publish never unloads another run's); without, any run's: a run's own
    rows keep the names they were sampled under, which a run dir moved elsewhere (another tag) or
    resumed from before per-run names still reads as its versions."""
    if base is not None and name == base:
        return 0
    m = re.fullmatch(r"(?:(.+)-)?policy-v(\d+)", name or "")
    if m is None or (tag is not None and m.group(1) not in (None, tag)):
        return None
    return int(m.group(2))


def weights_digest(adapter_dir: str | Path) -> str | None:
    """sha256 of an adapter's weights file (None: it has none)."""
    path = Path(adapter_dir) / "adapter_model.safetensors"  # the one file vLLM and the engine load
    if not path.is_file():
        return None
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
