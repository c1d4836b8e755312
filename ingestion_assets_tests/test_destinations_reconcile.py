"""Reconciliation on MariaDB (checksums in MySQL's SQL) and on lakes (the table format's rows in DuckDB's view,
deletions as one commit): the hard deletes polling cannot see are found and applied, late rows repaired."""

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


def _target(request: pytest.FixtureRequest, harness: StreamHarness, kind: str, tmp_path: Path) -> Any:
    """The destination of `kind` for the catalog, and a reader of the target's rows (COLUMNS, by id)."""
    if kind == "mariadb":
        db: MariaDb = request.getfixturevalue("mariadb")
        db.datasets.append(harness.source_name)
        return db.destination(), lambda: db.rows(harness.source_name, "items", COLUMNS, "id")
    url = str(tmp_path / "lake" / harness.source_name / "items")
    lake = {"type": "filesystem", "bucket_url": str(tmp_path / "lake"), "table_format": kind}
    return lake, lambda: lake_rows(kind, url, COLUMNS, "id")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "mode"), [("delta", "hard"), ("iceberg", "soft"), ("mariadb", "hard"), ("mariadb", "soft")]
)
def test_hard_deletes_are_found_and_applied_in_mariadb_and_lakes(
    request: pytest.FixtureRequest, harness: StreamHarness, tmp_path: Path, kind: str, mode: str
) -> None:
    harness.source.execute(ITEMS)
    destination, target = _target(request, harness, kind, tmp_path)
    _catalog(harness, destination, mode)
    assert _check(harness.materialize()).passed
    harness.source.execute("DELETE FROM items WHERE id IN (5, 77, 150)")  # a hard delete: polling cannot see it
    # a late row behind the checkpoint: read again by key, merged into the table format like any slice
    harness.source.execute("INSERT INTO items VALUES (999, 'late', timestamptz '2024-01-01 00:00:05.5+00')")

    check = _check(harness.materialize())
    assert check.passed, check.metadata
    figures = {label: value.value for label, value in check.metadata.items()}
    assert figures["in target only (deleted at the source)"] == 3 and figures["deletions applied"] == 3
    assert figures["source rows compared"] == 298 and figures["target rows compared"] == 300
    assert figures["read again by key (repaired)"] == 1 and figures["sample of repaired keys"] == ["999"]
    rows = target()
    source = [(r[0], r[1]) for r in harness.source.rows("items", "id")]
    if mode == "hard":
        assert [(r[0], r[1]) for r in rows] == source and all(r[2] is None for r in rows)
    else:  # kept with their last values, flagged; the live rows equal the source
        assert [(r[0], r[1]) for r in rows if r[2] is not None] == [(5, "item 5"), (77, "item 77"), (150, "item 150")]
        assert [(r[0], r[1]) for r in rows if r[2] is None] == source
    again = _check(harness.materialize())  # applied once: nothing left to find
    assert again.passed and again.metadata["deletions applied"].value == 0
    assert again.metadata["buckets differing"].value == 0


@pytest.mark.slow
def test_a_window_reconciliation_on_mariadb_compares_the_cursor_range_a_run_read(
    request: pytest.FixtureRequest, harness: StreamHarness, tmp_path: Path
) -> None:
    """The window's bounds are timestamptz literals cast to DATETIME(6), which holds UTC."""
    harness.source.execute(ITEMS)
    destination, _ = _target(request, harness, "mariadb", tmp_path)
    stream = {"table": "items", "primary_key": "id", "cursor": "updated_at", "slice_rows": 100}
    harness.write_catalog({"items": {**stream, "retries": {"max_attempts": 1}, "reconcile": "window"}})
    use_destination(harness, destination)
    first = _check(harness.materialize())
    assert first.passed and first.metadata["source rows compared"].value == 300, first.metadata
    harness.source.execute("UPDATE items SET name = 'renamed', updated_at = now() WHERE id % 30 = 0")
    check = _check(harness.materialize())
    assert check.passed, check.metadata
    assert check.metadata["source rows compared"].value == 10 and check.metadata["target rows compared"].value == 10
    assert check.metadata["buckets differing"].value == 0


def test_rows_with_a_null_key_are_counted_apart_on_mariadb(
    request: pytest.FixtureRequest, harness: StreamHarness, tmp_path: Path
) -> None:
    """A table without a primary key holding rows whose declared key is NULL: parked by the load, counted apart by
    the comparison on MySQL's side too (it crashed the comparison on every destination; README-only attack)."""
    harness.source.execute(
        "CREATE TABLE items (id int, name text NOT NULL, updated_at timestamptz NOT NULL);"  # no constraint
        "INSERT INTO items SELECT g, 'item ' || g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second'"
        " FROM generate_series(1, 300) g;"
        "INSERT INTO items VALUES (NULL, 'no key', timestamptz '2024-01-01 00:00:10.5+00')"
    )
    destination, target = _target(request, harness, "mariadb", tmp_path)
    _catalog(harness, destination, "hard")
    check = _check(harness.materialize())
    assert check.passed, check.metadata
    assert check.metadata["source rows with a NULL key (not compared; parked as dead letters)"].value == 1
    assert check.metadata["source rows compared"].value == 300 and check.metadata["missing in target"].value == 0
    assert [r[0] for r in target()] == list(range(1, 301))
