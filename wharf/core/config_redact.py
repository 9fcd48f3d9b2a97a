"""What a recorded config may not hold: the run's secrets. Every config written into a run dir (the
run's own, a round's, the record of what a child process ran with) is redacted here; the whole
config a child process needs goes to a private file outside the run dir (procs.stage_argv), so a
run dir, pushed to a bucket or copied to a colleague, carries no key, token or agent credential."""
from __future__ import annotations

import dataclasses
import json
import re
import typing
from pathlib import Path
from typing import Iterable

from wharf.core.config_types import Secret

REDACTED = "<redacted>"
MIN_SECRET = 6
# Words that name a credential: inside a kwargs key (_secretish), or as a whole word of a config
# key read back as plain dicts (redacted_mapping).
_SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "credential", "credentials",
                           "authorization", "auth"})
_SECRET_META = typing.get_args(Secret)[1:]  # the validator that marks a field as a Secret


def _is_secret(hint) -> bool:
    """`Secret` or `Secret | None`."""
    for arg in (hint, *typing.get_args(hint)):
        if typing.get_origin(arg) is typing.Annotated and typing.get_args(arg)[1:] == _SECRET_META:
            return True
    return False


def _secretish(name: str) -> bool:
    return any(w in name.lower() for w in _SECRET_WORDS)


def _scrub_kwargs(value):
    """A free-form mapping (an agent's kwargs): values under credential-like keys redacted, at any depth."""
    if isinstance(value, dict):
        return {k: REDACTED if _secretish(str(k)) and v not in (None, "") else _scrub_kwargs(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub_kwargs(v) for v in value]
    return value


def _scrub(cls: type, data: dict) -> dict:
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        hint, value = hints[f.name], data.get(f.name)
        if value is None:
            continue
        if _is_secret(hint):
            data[f.name] = None  # unset: whoever loads the record gets a fresh one per run
        elif f.name.endswith("_env") and isinstance(value, dict):
            data[f.name] = {k: REDACTED for k in value}  # an agent's env is credentials more often than not
        elif f.name.endswith("_kwargs"):
            data[f.name] = _scrub_kwargs(value)
        elif dataclasses.is_dataclass(hint) and isinstance(value, dict):
            _scrub(hint, value)
    return data


def redacted(cfg) -> dict:
    """`cfg` (a config dataclass) as a dict with every secret taken out."""
    return _scrub(type(cfg), dataclasses.asdict(cfg))


def redacted_mapping(value, name: str = ""):
    """A config read back as plain dicts (a run's config.yaml, perhaps from before records were
    redacted) with every value under a credential-like key replaced by REDACTED: what a report
    shows and a tracker is sent."""
    if isinstance(value, dict):
        return {k: redacted_mapping(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted_mapping(v, name) for v in value]
    words = set(re.split(r"[^a-z0-9]+", name.lower()))
    if value is not None and words & _SECRET_WORDS:
        return REDACTED
    return value


def secret_values(cfg) -> list[str]:
    """Every value `redacted` takes out of `cfg`: what a scan of a run dir must not find."""
    full, red = dataclasses.asdict(cfg), redacted(cfg)
    out: list[str] = []

    def walk(a, b):
        if isinstance(a, dict):
            for k, v in a.items():
                walk(v, b.get(k) if isinstance(b, dict) else None)
        elif isinstance(a, list):
            for i, v in enumerate(a):
                walk(v, b[i] if isinstance(b, list) and i < len(b) else None)
        elif isinstance(a, str) and a and a != b:
            out.append(a)
    walk(full, red)
    return out


def _replace(value, secrets: set[str]):
    if isinstance(value, dict):
        return {k: _replace(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v, secrets) for v in value]
    return REDACTED if isinstance(value, str) and value in secrets else value


def scrub_json_files(directory: Path, secrets: Iterable[str]) -> int:
    """Every string equal to one of `secrets` in the JSON files directly in `directory` replaced by
    REDACTED (harbor records a trial's agent env and kwargs in its config.json and result.json,
    and hides only env names it deems sensitive). Values shorter than MIN_SECRET are left alone (an
    env's `LANG=C` is no credential, and "C" may be any field's value). Returns how many files changed."""
    secrets = {s for s in secrets if len(s) >= MIN_SECRET}
    changed = 0
    for path in sorted(Path(directory).glob("*.json")) if secrets else ():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # not ours to judge: a file harbor left half-written stays as it is
        clean = _replace(data, secrets)
        if clean != data:
            path.write_text(json.dumps(clean, indent=4))
            changed += 1
    return changed
