import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wharf.core.schema import SchemaError, read_dir, read_table, write_table


def turn(i=0):
    return {
        "rollout_id": "r1", "turn": i, "request_id": f"q{i}", "api": "chat", "policy": "base",
        "started_at": 1700000000.0, "ended_at": 1700000001.5,
        "request": json.dumps({"messages": []}), "response": "{}", "sampling": "{}",
        "prompt_token_ids": [1, 2, 3], "completion_token_ids": [4, 5],
        "completion_logprobs": [-0.5, -0.25], "finish_reason": "stop", "status": "ok", "error": None,
    }


def test_roundtrip_with_pandas_and_duckdb(tmp_path):
    path = write_table(tmp_path / "part-0.parquet", "turns", [turn(0), turn(1)])
    table = read_table(path, "turns")
    assert table.num_rows == 2
    assert table.schema.field("prompt_token_ids").type == pa.list_(pa.int32())
    df = pq.read_table(path).to_pandas()
    assert list(df["completion_token_ids"][1]) == [4, 5]
    duckdb = pytest.importorskip("duckdb")
    assert duckdb.sql(f"select sum(len(prompt_token_ids)) from '{path}'").fetchall()[0][0] == 6


def test_missing_field_is_named(tmp_path):
    row = turn()
    del row["policy"]
    with pytest.raises(SchemaError, match="missing field 'policy'"):
        write_table(tmp_path / "x.parquet", "turns", [row])


def test_foreign_corrupt_and_future_files_refused(tmp_path):
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"a": [1]}), foreign)
    with pytest.raises(SchemaError, match="foreign.parquet: no schema_version"):
        read_table(foreign, "turns")

    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1 not really")
    with pytest.raises(SchemaError, match="corrupt.parquet: not a readable parquet"):
        read_table(corrupt, "turns")

    path = write_table(tmp_path / "t.parquet", "turns", [turn()])
    t = pq.read_table(path)
    future = tmp_path / "future.parquet"
    pq.write_table(t.replace_schema_metadata({b"schema_version": b"99", b"table": b"turns"}), future)
    with pytest.raises(SchemaError, match="future.parquet: schema_version 99"):
        read_table(future, "turns")
    with pytest.raises(SchemaError, match="holds a 'turns' table, expected 'rollouts'"):
        read_table(path, "rollouts")


def test_read_dir_concatenates_and_handles_empty(tmp_path):
    assert read_dir(tmp_path, "turns").num_rows == 0
    write_table(tmp_path / "part-00000.parquet", "turns", [turn(0)])
    write_table(tmp_path / "part-00001.parquet", "turns", [turn(1)])
    assert read_dir(tmp_path, "turns").column("turn").to_pylist() == [0, 1]


def test_compact_dir_is_crash_safe(tmp_path):
    for i in range(3):
        write_table(tmp_path / f"part-0000{i}.parquet", "turns", [turn(i)])
    from wharf.core.schema import compact_dir, shard_files

    before = read_dir(tmp_path, "turns").column("turn").to_pylist()
    out = compact_dir(tmp_path, "turns")
    assert [f.name for f in shard_files(tmp_path)] == [out.name]
    assert read_dir(tmp_path, "turns").column("turn").to_pylist() == before
    # a crash after the compacted shard was written but before the old ones were deleted:
    # readers must not see the rows twice
    write_table(tmp_path / "part-00001.parquet", "turns", [turn(1)])
    import json

    meta = pq.read_schema(out).metadata
    assert "part-00001.parquet" in json.loads(meta[b"replaces"])
    assert read_dir(tmp_path, "turns").column("turn").to_pylist() == before
    assert compact_dir(tmp_path / "nothing-here", "turns") is None


def test_compacting_again_after_an_interrupted_compaction_counts_nothing_twice(tmp_path):
    from wharf.core.schema import compact_dir

    for i in range(2):
        write_table(tmp_path / f"part-0000{i}.parquet", "turns", [turn(i)])
    compact_dir(tmp_path, "turns")
    write_table(tmp_path / "part-00000.parquet", "turns", [turn(0)])  # left by a crash before the delete
    write_table(tmp_path / "part-00009.parquet", "turns", [turn(2)])  # a new shard
    out = compact_dir(tmp_path, "turns")
    assert [f.name for f in sorted(tmp_path.glob("part-*.parquet"))] == [out.name]
    assert sorted(read_dir(tmp_path, "turns").column("turn").to_pylist()) == [0, 1, 2]


def test_a_version_1_turns_file_reads_as_not_text_only(tmp_path):
    """Schema v2 added turns.text_only; shards written before it read with text_only false."""
    path = write_table(tmp_path / "new.parquet", "turns", [turn(0)])  # no text_only key: the default
    t = pq.read_table(path)
    assert t.column("text_only").to_pylist() == [False]
    v1 = tmp_path / "v1.parquet"
    pq.write_table(t.drop(["text_only"]).replace_schema_metadata({b"schema_version": b"1", b"table": b"turns"}), v1)
    old = read_table(v1, "turns")
    assert old.column_names == read_table(path, "turns").column_names
    assert old.column("text_only").to_pylist() == [False]
    assert read_table(v1, "turns", ["rollout_id", "text_only"]).column("text_only").to_pylist() == [False]
    with pytest.raises(SchemaError, match="v1.parquet: missing columns \\['nope'\\]"):
        read_table(v1, "turns", ["nope"])
    text = write_table(tmp_path / "t.parquet", "turns", [{**turn(1), "text_only": True}])
    assert read_dir(tmp_path, "turns", "t.parquet").column("text_only").to_pylist() == [True]
    assert pq.read_metadata(text).metadata[b"schema_version"] == b"3"


def test_a_version_2_rollouts_table_reads_with_its_call_errors_unrecorded(tmp_path):
    """Schema v3 added rollouts.n_errors (the proxy's count of failed upstream calls); a table
    written before it reads with n_errors null (not recorded), never as 0 errors."""
    import datetime as dt

    from wharf.collect.records import RolloutRow

    now = dt.datetime.now(dt.timezone.utc)
    row = RolloutRow("r0", "j", 0, "t", "j.t", 0, "p", None, "{}", "infra_error", 3, 2, now, now, "harbor/r0", "404")
    path = write_table(tmp_path / "rollouts.parquet", "rollouts", [row.as_dict()])
    assert read_table(path, "rollouts").column("n_errors").to_pylist() == [2]
    v2 = tmp_path / "v2.parquet"
    t = pq.read_table(path).drop(["n_errors"])
    pq.write_table(t.replace_schema_metadata({b"schema_version": b"2", b"table": b"rollouts"}), v2)
    old = read_table(v2, "rollouts")
    assert old.column_names == read_table(path, "rollouts").column_names
    assert old.column("n_errors").to_pylist() == [None]
    assert RolloutRow.from_dict(old.to_pylist()[0]).n_errors is None
