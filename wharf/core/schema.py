"""The parquet contract between collect and convert: turns and rollouts.

Every file carries `schema_version` and `table` in its metadata. Readers refuse files they do
not know, naming the file; writers publish atomically (temp file + rename) so a reader never
sees half a shard.
"""
from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from wharf.core import atomic
from wharf.core.errors import WharfError

SCHEMA_VERSION = 3
KNOWN_VERSIONS = {1, 2, 3}
# Columns a version added, with the value a file of an older version reads as: v2 marks the calls
# of a teacher without token ids, or imported from trajectory files (text_only: SFT rows only);
# v3 counts a rollout's upstream call errors (n_errors; null in an older table: not recorded).
ADDED_COLUMNS = {"turns": {"text_only": False}, "rollouts": {"n_errors": None}}

_TS = pa.timestamp("us", tz="UTC")

TURNS = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("turn", pa.int32()),
        ("request_id", pa.string()),
        ("api", pa.string()),  # chat | anthropic | responses | gemini
        ("policy", pa.string()),
        ("started_at", _TS),
        ("ended_at", _TS),
        ("request", pa.string()),  # JSON, as the agent sent it
        ("response", pa.string()),  # JSON, as returned to the agent
        ("sampling", pa.string()),  # JSON, the parameters sent upstream
        ("prompt_token_ids", pa.list_(pa.int32())),
        ("completion_token_ids", pa.list_(pa.int32())),
        ("completion_logprobs", pa.list_(pa.float32())),
        ("finish_reason", pa.string()),
        ("status", pa.string()),  # TURN_STATUSES
        ("error", pa.string()),
        ("text_only", pa.bool_()),  # no token ids or log-probs: the request and the answer's text only
    ]
)

# ok: answered; error: the upstream failed (the agent got the error); abandoned: the agent's connection
# was gone before its answer could be sent, so the call is not part of what it saw (convert skips it).
TURN_STATUSES = ("ok", "error", "abandoned")

ROLLOUT_STATUSES = ("ok", "agent_error", "agent_timeout", "context_exceeded", "infra_error", "verifier_error")

ROLLOUTS = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("job_id", pa.string()),
        ("round", pa.int32()),
        ("task_id", pa.string()),
        ("group_id", pa.string()),
        ("attempt", pa.int32()),
        ("policy", pa.string()),
        ("reward", pa.float64()),
        ("rewards", pa.string()),  # JSON: every key the verifier wrote
        ("status", pa.string()),
        ("n_turns", pa.int32()),
        ("n_errors", pa.int32()),  # calls the endpoint did not complete (the proxy's count at close)
        ("started_at", _TS),
        ("ended_at", _TS),
        ("trial_dir", pa.string()),
        ("error", pa.string()),
    ]
)

TABLES = {"turns": TURNS, "rollouts": ROLLOUTS}


class SchemaError(WharfError, ValueError):
    """A parquet file that is not one of ours, is corrupt, or has a version we do not know."""


def _timestamp(value):
    """Accept epoch seconds (float) or datetimes for timestamp columns."""
    if value is None or isinstance(value, dt.datetime):
        return value
    return dt.datetime.fromtimestamp(float(value), tz=dt.timezone.utc)


def to_table(name: str, rows: Iterable[dict]) -> pa.Table:
    """Rows (dicts keyed by column) -> an Arrow table of `name`'s schema; a missing column is an error."""
    schema = TABLES[name]
    rows = list(rows)
    columns = {}
    added = ADDED_COLUMNS[name]
    for f in schema:
        try:
            values = [r[f.name] if f.name not in added else r.get(f.name, added[f.name]) for r in rows]
        except KeyError:
            missing = next(r for r in rows if f.name not in r)
            raise SchemaError(f"{name} row is missing field '{f.name}': {sorted(missing)}") from None
        if pa.types.is_timestamp(f.type):
            values = [_timestamp(v) for v in values]
        columns[f.name] = pa.array(values, type=f.type)
    return pa.Table.from_pydict(columns, schema=schema)


def _metadata(name: str, extra: dict[str, str] | None = None) -> dict[bytes, bytes]:
    meta = {b"schema_version": str(SCHEMA_VERSION).encode(), b"table": name.encode()}
    meta.update({k.encode(): v.encode() for k, v in (extra or {}).items()})
    return meta


def write_table(path: str | Path, name: str, table: pa.Table | Iterable[dict],
                extra_metadata: dict[str, str] | None = None) -> Path:
    """Write atomically: a temp file in the same directory, fsync, rename over `path`, fsync the directory."""
    if not isinstance(table, pa.Table):
        table = to_table(name, table)
    table = table.replace_schema_metadata(_metadata(name, extra_metadata))
    return atomic.write_with(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"), durable=True)


def read_table(path: str | Path, name: str, columns: list[str] | None = None) -> pa.Table:
    """Read one of our files, refusing foreign, corrupt or newer files with a message naming it.
    `columns`: only these (convert skips the request/response JSON, often the bulk of a shard)."""
    path = Path(path)
    try:
        pf = pq.ParquetFile(path)
    except FileNotFoundError:
        raise SchemaError(f"{path}: no such file") from None
    except (pa.ArrowException, OSError) as e:
        raise SchemaError(f"{path}: not a readable parquet file ({e}); delete or move it aside") from None
    meta = pf.schema_arrow.metadata or {}
    version = meta.get(b"schema_version")
    table = meta.get(b"table")
    if version is None or table is None:
        raise SchemaError(f"{path}: no schema_version/table metadata: not a wharf {name} file")
    if table.decode() != name:
        raise SchemaError(f"{path}: holds a '{table.decode()}' table, expected '{name}'")
    if int(version) not in KNOWN_VERSIONS:
        raise SchemaError(
            f"{path}: schema_version {version.decode()} is not one this wharf reads "
            f"({sorted(KNOWN_VERSIONS)}); upgrade wharf to read it"
        )
    wanted = columns or [f.name for f in TABLES[name]]
    have = pf.schema_arrow.names
    filled = {c: v for c, v in ADDED_COLUMNS[name].items() if c in wanted and c not in have}
    missing = [c for c in wanted if c not in have and c not in filled]
    if missing:
        raise SchemaError(f"{path}: missing columns {missing}")
    try:
        out = pf.read(columns=[c for c in wanted if c not in filled])
    except (pa.ArrowException, OSError) as e:
        raise SchemaError(f"{path}: corrupt parquet data ({e})") from None
    for c, v in filled.items():  # an older file: the column it predates, at its old meaning
        out = out.append_column(TABLES[name].field(c), pa.array([v] * out.num_rows, TABLES[name].field(c).type))
    return out.select(wanted)


def _replaced(files: list[Path]) -> set[str]:
    """Names of shards that a compacted shard in the same directory already holds."""
    names: set[str] = set()
    for f in files:
        try:
            meta = pq.read_schema(f).metadata or {}
        except (pa.ArrowException, OSError):
            continue  # read_table will name it
        if b"replaces" in meta:
            names.update(json.loads(meta[b"replaces"]))
    return names


def shard_files(directory: str | Path, pattern: str = "part-*.parquet") -> list[Path]:
    files = sorted(Path(directory).glob(pattern))
    gone = _replaced(files)
    return [f for f in files if f.name not in gone]


def read_dir(directory: str | Path, name: str, pattern: str = "part-*.parquet") -> pa.Table:
    """Concatenate every shard of `name` in `directory` (an empty table when there is none)."""
    files = shard_files(directory, pattern)
    if not files:
        return TABLES[name].empty_table()
    return pa.concat_tables([read_table(f, name) for f in files])


# The column that names a row once: a shard re-sent under a new key (an upload that landed, then a
# crash before its check) holds rows another shard has; folding keeps the first of each.
ROW_KEYS = {"turns": "request_id"}


def _first_of_each(table: pa.Table, key: str | None) -> pa.Table:
    if key is None:
        return table
    seen: set = set()
    keep = [i for i, k in enumerate(table.column(key).to_pylist()) if not (k in seen or seen.add(k))]
    return table if len(keep) == table.num_rows else table.take(keep)


def compact_dir(directory: str | Path, name: str, pattern: str = "part-*.parquet") -> Path | None:
    """Fold many small shards into one. Crash-safe without locks: the new shard names the ones it
    replaces in its metadata (readers skip those), and only then are they deleted. Call it only
    when no writer is running in `directory`."""
    files = shard_files(directory, pattern)
    if len(files) < 2:
        return None
    # Shards an earlier, interrupted compaction already folded: they must go before the shard
    # that names them does, or they would count again.
    leftovers = [f for f in Path(directory).glob(pattern) if f not in files]
    table = _first_of_each(pa.concat_tables([read_table(f, name) for f in files]), ROW_KEYS.get(name))
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    out = write_table(Path(directory) / f"part-{stamp}-compact-{uuid.uuid4().hex[:6]}.parquet", name, table,
                      {"replaces": json.dumps([f.name for f in files])})
    for f in leftovers + files:
        f.unlink(missing_ok=True)
    return out
