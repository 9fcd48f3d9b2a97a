"""The typed records match the parquet contract and the admin API's wire format."""
from __future__ import annotations

import pytest

from wharf.core import schema
from wharf.collect.records import ROLLOUT_FIELDS, TURN_FIELDS, ClosedRollout, OpenedRollout, RecordError, TurnRow


def test_row_fields_are_the_schema_columns_in_order():
    assert TURN_FIELDS == tuple(schema.TURNS.names)
    assert ROLLOUT_FIELDS == tuple(schema.ROLLOUTS.names)


def test_turn_row_converts_to_a_turns_table():
    row = TurnRow("r", 0, "id", "chat", "p", 1700000000.0, 1700000001.0, "{}", "{}", "{}", [1, 2], [3], [-0.5], "stop")
    assert schema.to_table("turns", [row.as_dict()]).num_rows == 1


def test_admin_answer_round_trip_and_missing_field_named():
    opened = OpenedRollout("r", "http://x/rollout/r/v1", "wr-k", "p")
    assert OpenedRollout.from_json(opened.to_json()) == opened
    with pytest.raises(RecordError, match=r"proxy POST /close: answer lacks \['n_errors', 'published'\]"):
        ClosedRollout.from_json({"rollout_id": "r", "n_turns": 1}, "proxy POST /close")
