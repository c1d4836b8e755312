"""Reconciliation on lakes (the table format's rows in DuckDB's view, deletions as one commit) and its refusal on
MariaDB, which names the stream, the option and what to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from ingestion_assets_tests.destination_targets import MariaDb, lake_rows, mariadb, use_destination
from ingestion_assets_tests.helpers import StreamHarness

__all__ = ["mariadb"]

ITEMS = """
CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, updated_at timestamptz NOT NULL);
INSERT INTO items SELECT g, 'item ' || g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second'
FROM generate_series(1, 300) g;
"""
COLUMNS = ["id", "name", "_ingest_deleted_at"]


def _catalog(harness: StreamHarness, destination: dict[str, Any], mode: str) -> None:
    stream = {"table": "items", "primary_key": "id", "cursor": "updated_at", "slice_rows": 100}
    reconcile = {"full_every_seconds": 0, "deletes": mode}
    harness.write_catalog({"items": {**stream, "retries": {"max_attempts": 1}, "reconcile": reconcile}})
    use_destination(harness, destination)


def _check(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    return next(e for e in result.get_asset_check_evaluations() if e.check_name == "reconciliation")


@pytest.mark.slow
@pytest.mark.parametrize(("table_format", "mode"), [("delta", "hard"), ("iceberg", "soft")])
def test_hard_deletes_are_found_and_applied_in_a_lake(
    harness: StreamHarness, tmp_path: Path, table_format: str, mode: str
) -> None:
    harness.source.execute(ITEMS)
    lake = {"type": "filesystem", "bucket_url": str(tmp_path / "lake"), "table_format": table_format}
    _catalog(harness, lake, mode)
    url = str(tmp_path / "lake" / harness.source_name / "items")
    assert _check(harness.materialize()).passed
    harness.source.execute("DELETE FROM items WHERE id IN (5, 77, 150)")  # a hard delete: polling cannot see it

    check = _check(harness.materialize())
    assert check.passed, check.metadata
    figures = {label: value.value for label, value in check.metadata.items()}
    assert figures["in target only (deleted at the source)"] == 3 and figures["deletions applied"] == 3
    assert figures["source rows compared"] == 297 and figures["target rows compared"] == 300
    rows = lake_rows(table_format, url, COLUMNS, "id")
    source = [(r[0], r[1]) for r in harness.source.rows("items", "id")]
    if mode == "hard":
        assert [(r[0], r[1]) for r in rows] == source and all(r[2] is None for r in rows)
    else:  # kept with their last values, flagged; the live rows equal the source
        assert [(r[0], r[1]) for r in rows if r[2] is not None] == [(5, "item 5"), (77, "item 77"), (150, "item 150")]
        assert [(r[0], r[1]) for r in rows if r[2] is None] == source
    again = _check(harness.materialize())  # applied once: nothing left to find
    assert again.passed and again.metadata["deletions applied"].value == 0


@pytest.mark.slow
def test_reconciliation_on_mariadb_is_refused_naming_the_stream_and_what_to_do(
    harness: StreamHarness, mariadb: MariaDb
) -> None:
    harness.source.execute(ITEMS)
    _catalog(harness, mariadb.destination(), "hard")
    mariadb.datasets.append(harness.source_name)
    check = _check(harness.materialize())
    skipped = str(check.metadata)
    assert f"stream {harness.source_name}.items" in skipped and "`reconcile`" in skipped and "reconcile: off" in skipped
