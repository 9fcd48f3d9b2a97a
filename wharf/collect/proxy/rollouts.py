"""The rollout registry: which rollouts are open, under which id and API key, with which sampling.

A call is taken only with its rollout's key (the id alone, part of a URL that shows up in logs
and trial dirs, is not a credential); the file below holds every key and is the owner's only.

Every open and close is appended to <wal_dir>/rollouts.jsonl, so a restarted proxy knows the same
rollouts and agents keep their URLs and keys; their turn and row counters resume from the WAL and
the published shards. No HTTP here beyond reading who a request is for (`for_request`).
"""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from wharf.core.credentials import bearer
from wharf.collect.proxy.errors import Reject
from wharf.core.schema import shard_files
from wharf.collect.proxy.jsonx import dumps
from wharf.collect.proxy.wal import read_records, write_all

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger("wharf.proxy")


@dataclass
class Rollout:
    rollout_id: str
    api_key: str
    policy: str
    temperature: float
    top_p: float
    seed: int | None = None  # set: call k of the rollout is sampled with seed + k (reproducible rounds)
    state: str = "open"
    next_turn: int = 0
    n_turns: int = 0
    n_errors: int = 0
    inflight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self):
        self.idle.set()


class RolloutRegistry:
    def __init__(self, path: Path):
        self.path = path
        self.by_id: dict[str, Rollout] = {}
        self.by_key: dict[str, Rollout] = {}
        self._fd: int | None = None

    def load(self, last_turn: dict[str, int], out_dir: Path) -> None:
        """Replay the registry file (after the WAL's recovery, whose `last_turn` says where turns resume)."""
        path = self.path
        if path.exists():
            records, bad = read_records(path)
            if bad:
                log.error("%s: %d unreadable registry lines were skipped", path, bad)
            for rec in records:
                rid = rec.get("rollout_id")
                if rec.get("event") == "open":
                    r = Rollout(rid, rec["api_key"], rec["policy"], rec["temperature"], rec["top_p"], rec.get("seed"))
                    self.by_id[rid] = r
                    self.by_key[r.api_key] = r
                elif rec.get("event") == "close" and rid in self.by_id:
                    self.by_id[rid].state = "closed"
            if self.by_id:
                counts = _row_counts(out_dir)
                for rid, r in self.by_id.items():
                    r.next_turn = last_turn.get(rid, -1) + 1
                    r.n_turns, r.n_errors = counts.get(rid, (0, 0))
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # holds every rollout's key: the owner's only
        os.fchmod(self._fd, 0o600)  # a file made before by an older version

    def shutdown(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _append(self, rec: dict) -> None:
        write_all(self._fd, dumps(rec) + b"\n")

    def get(self, rollout_id: str) -> Rollout | None:
        return self.by_id.get(rollout_id)

    def n_open(self) -> int:
        return sum(r.state == "open" for r in self.by_id.values())

    def open(self, rollout_id: str, policy: str, temperature: float, top_p: float, seed: int | None) -> Rollout:
        """A new rollout with a fresh API key, on disk before anyone can use it."""
        r = Rollout(rollout_id, "wr-" + secrets.token_urlsafe(18), policy, temperature, top_p, seed)
        self._append({"event": "open", "rollout_id": rollout_id, "api_key": r.api_key, "policy": policy,
                      "temperature": temperature, "top_p": top_p, "seed": seed, "t": time.time()})
        self.by_id[rollout_id] = r
        self.by_key[r.api_key] = r
        return r

    def close(self, r: Rollout) -> bool:
        """Refuse its further calls; True when this closed it (False: it was closed already)."""
        if r.state != "open":
            return False
        r.state = "closed"
        self._append({"event": "close", "rollout_id": r.rollout_id, "t": time.time()})
        return True

    def for_request(self, request: web.Request) -> Rollout:
        """The open rollout an agent call belongs to, by its API key (`agent_key`); on a
        /rollout/<id> route the key must be that rollout's: knowing an id is not enough."""
        key = agent_key(request)
        r = self.by_key.get(key) if key else None
        rid = request.match_info.get("rollout_id")
        if rid is not None:
            if rid not in self.by_id:
                raise Reject(404, f"unknown rollout '{rid}': open it with POST /admin/rollouts first",
                             "unknown_rollout", "not_found_error")
            if r is None or r.rollout_id != rid:
                raise Reject(401, f"rollout '{rid}' needs its own API key (the api_key POST /admin/rollouts "
                                  "returned) as `Authorization: Bearer KEY`, `x-api-key: KEY` or "
                                  "`x-goog-api-key: KEY`",
                             "bad_rollout_key", "authentication_error")
        elif r is None:
            raise Reject(401, "unknown API key: use the api_key POST /admin/rollouts returned",
                         "unknown_key", "authentication_error")
        if r.state != "open":
            raise Reject(403, f"rollout '{r.rollout_id}' is closed", "closed_rollout", "permission_error")
        return r


def agent_key(request: web.Request) -> str:
    """The key an agent sent, as its SDK sends it: `Authorization: Bearer`, Anthropic's `x-api-key`,
    Google's `x-goog-api-key` or `?key=`. Only ever compared, never sent upstream."""
    return bearer(request.headers, anthropic=True) or request.headers.get("x-goog-api-key", "").strip() \
        or request.query.get("key", "")


def _row_counts(out_dir: Path) -> dict[str, tuple[int, int]]:
    """(rows, error rows) per rollout over the published shards, to resume counters after a restart."""
    counts: dict[str, list[int]] = {}
    for f in shard_files(out_dir):
        t = pq.read_table(f, columns=["rollout_id", "status"])
        for rid, st in zip(t.column("rollout_id").to_pylist(), t.column("status").to_pylist()):
            c = counts.setdefault(rid, [0, 0])
            c[0] += 1
            c[1] += st != "ok"
    return {k: (v[0], v[1]) for k, v in counts.items()}
