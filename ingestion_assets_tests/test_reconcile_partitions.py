"""Partitions reconcile their own window: deletes found in one key range leave the others alone, and a row
that moved to another time window is not deleted while the source still has it."""

from __future__ import annotations

from typing import Any

import dagster as dg

from ingestion_assets.partitions import LIVE
from ingestion_assets_tests.helpers import StreamHarness, load_daily_events

DETECT = {"full_every_seconds": 0, "deletes": "hard"}


def _check(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    return next(e for e in result.get_asset_check_evaluations() if e.check_name == "reconciliation")


def _ids(harness: StreamHarness, stream: str) -> list[Any]:
    return [r[0] for r in harness.query_target(f'SELECT id FROM "{harness.source_name}"."{stream}" ORDER BY id')]


def test_a_key_range_applies_the_deletes_of_its_own_range_only(harness: StreamHarness) -> None:
    harness.source.execute(
        "CREATE TABLE items (id int PRIMARY KEY, name text, updated_at timestamptz NOT NULL);"
        "INSERT INTO items SELECT g, 'n' || g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 s' "
        "FROM generate_series(1, 300) g"
    )
    spec = {"table": "items", "primary_key": "id", "cursor": "updated_at", "partitions": {"by": "key", "chunk": 100}}
    harness.write_catalog({"items": {**spec, "reconcile": DETECT}})
    keys = harness.plan_partitions("items")
    harness.materialize(partition_range=(keys[0], keys[-2]))
    harness.source.execute("DELETE FROM items WHERE id IN (50, 150)")

    check = _check(harness.materialize(partition="0-99"))
    assert check.passed and check.metadata["deletions applied"].value == 1
    assert check.metadata["source rows compared"].value == 98  # the range's rows only (1-99, less 50)
    assert 50 not in _ids(harness, "items") and 150 in _ids(harness, "items")

    check = _check(harness.materialize(partition=LIVE))  # the live tail's full scope is the whole table
    assert check.passed and check.metadata["deletions applied"].value == 1
    harness.assert_target_equals_source("items", "items", "id")


def test_a_row_moved_to_a_newer_time_window_is_not_deleted_from_the_old_one(harness: StreamHarness) -> None:
    load_daily_events(harness, DETECT)
    harness.source.execute(
        "UPDATE events SET v = 'moved', updated_at = '2024-01-02 12:00:00+00' WHERE id = 5;"
        "DELETE FROM events WHERE id = 6"
    )

    check = _check(harness.materialize(partition="2024-01-01"))
    assert check.passed and check.metadata["deletions applied"].value == 1  # 6, not 5: the source still has 5
    assert check.metadata["not yet synced (past the checkpoint)"].value == 1
    assert harness.target_rows_where("events", ["id", "v"], "id", "id IN (5, 6)") == [(5, "v5")]

    harness.materialize(partition="2024-01-02")
    harness.assert_target_equals_source("events", "events", "id")
