"""The records that cross collect's seams, in one place.

- The proxy's admin API (wharf/collect/proxy/admin.py builds them, wharf/collect/proxy_client.py reads them):
  `OpenedRollout`, `ClosedRollout`, `RolloutState`. On the wire they are JSON objects with
  exactly these field names.
- The parquet rows as they are built: `TurnRow` (the proxy, one per recorded call) and
  `RolloutRow` (the runner, one per trial); their fields are wharf.schema's TURNS and
  ROLLOUTS columns, in order (tests/test_records.py holds them to it).
- `Outcome`: what a finished harbor trial came to (wharf/collect/trials.py -> the runner).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Sequence


class RecordError(ValueError):
    """A JSON object that lacks the fields of the record it should be."""


def _from_json(cls, data: Any, where: str):
    names = [f.name for f in dataclasses.fields(cls)]
    if not isinstance(data, dict):
        raise RecordError(f"{where}: expected a JSON object with {names}, got {type(data).__name__}")
    missing = [n for n in names if n not in data]
    if missing:
        raise RecordError(f"{where}: answer lacks {missing} (got {sorted(data)})")
    return cls(**{n: data[n] for n in names})


class _Json:
    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str = ""):
        return _from_json(cls, data, where or cls.__name__)


# -- the proxy's admin API ---------------------------------------------------------------------
@dataclass(frozen=True)
class OpenedRollout(_Json):
    """POST /admin/rollouts: where the rollout's agent sends its calls."""

    rollout_id: str
    base_url: str  # <proxy>/rollout/<id>/v1
    api_key: str  # also accepted on plain /v1
    policy: str


@dataclass(frozen=True)
class ClosedRollout(_Json):
    """POST /admin/rollouts/<id>/close, once its calls are recorded and published."""

    rollout_id: str
    n_turns: int  # turns rows, errors included
    n_errors: int  # calls the endpoint did not complete
    published: bool  # every row of it is in a shard in the run's storage (false: still only in the WAL)


@dataclass(frozen=True)
class RolloutState(_Json):
    """GET /admin/rollouts/<id>."""

    rollout_id: str
    state: str  # open | closed
    n_turns: int
    n_errors: int
    policy: str
    inflight: int


# -- parquet rows ------------------------------------------------------------------------------
@dataclass(slots=True)
class TurnRow:
    """One recorded call (schema.TURNS). Times are epoch seconds; id/log-prob lists may be arrays."""

    rollout_id: str
    turn: int
    request_id: str
    api: str  # chat | anthropic | responses | gemini
    policy: str
    started_at: float
    ended_at: float | None
    request: str
    response: str | None
    sampling: str
    prompt_token_ids: Sequence[int] = field(default_factory=list)
    completion_token_ids: Sequence[int] = field(default_factory=list)
    completion_logprobs: Sequence[float] = field(default_factory=list)
    finish_reason: str | None = None
    status: str = "ok"  # schema.TURN_STATUSES: ok | error | abandoned
    error: str | None = None
    text_only: bool = False  # a teacher's call (proxy.text_only) or an imported one: no ids, SFT only

    def as_dict(self) -> dict:
        """The row as the store keeps it (the WAL's JSON line, a shard's row)."""
        return {name: getattr(self, name) for name in TURN_FIELDS}


@dataclass
class RolloutRow:
    """One trial (schema.ROLLOUTS)."""

    rollout_id: str
    job_id: str
    round: int
    task_id: str
    group_id: str  # the GRPO group: task_id within one job
    attempt: int
    policy: str
    reward: float | None
    rewards: str  # JSON: every key the verifier wrote
    status: str  # schema.ROLLOUT_STATUSES
    n_turns: int
    n_errors: int | None  # upstream call errors the proxy saw for it (None: a table from before v3)
    started_at: dt.datetime
    ended_at: dt.datetime
    trial_dir: str  # relative to the collect dir
    error: str | None

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in ROLLOUT_FIELDS}

    @classmethod
    def from_dict(cls, row: dict) -> "RolloutRow":
        return cls(**{name: row[name] for name in ROLLOUT_FIELDS})


TURN_FIELDS = tuple(f.name for f in dataclasses.fields(TurnRow))
ROLLOUT_FIELDS = tuple(f.name for f in dataclasses.fields(RolloutRow))


# -- trials ------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What a finished trial came to: a rollout status, its reward(s) and the error, if any."""

    status: str  # schema.ROLLOUT_STATUSES
    reward: float | None
    rewards: dict
    error: str | None
