"""A primary key of `numeric` without limits is one key per value in a PostgreSQL destination (1.0 = 1.00) and
one key per text in DuckDB (where it lands as text): the comparison keys it as its target does, so a change of
the key's scale is no false "missing" there, and is reported as a changed key here."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import dagster as dg
import pytest

from ingestion_assets_tests.helpers import StreamHarness

TABLE = """
CREATE TABLE t (id numeric PRIMARY KEY, v text NOT NULL, updated_at timestamptz NOT NULL);
INSERT INTO t VALUES (1.0, 'a', '2024-01-01 00:00:01+00'), (1.5, 'b', '2024-01-01 00:00:02+00'),
 (2.50, 'c', '2024-01-01 00:00:03+00'), (100, 'd', '2024-01-01 00:00:04+00'), (0.000, 'e', '2024-01-01 00:00:05+00'),
 (-3.10, 'f', '2024-01-01 00:00:06+00'), (12345678901234567890.50, 'g', '2024-01-01 00:00:07+00');
"""
NEW_SCALE = "UPDATE t SET id = 1.00, v = 'a2', updated_at = statement_timestamp() WHERE id = 1"


def _catalog(
    harness: StreamHarness, destination: str, reconcile: Any = "window", cursor: str | list[str] = "updated_at"
) -> None:
    stream = {"table": "t", "primary_key": "id", "cursor": cursor, "retries": {"max_attempts": 1}}
    harness.write_catalog({"t": {**stream, "reconcile": reconcile}}, destination=destination)


def _figures(result: dg.ExecuteInProcessResult) -> dict[str, Any]:
    check = next(e for e in result.get_asset_check_evaluations() if e.check_name == "reconciliation")
    return {"passed": check.passed, **{label: value.value for label, value in check.metadata.items()}}


def _target(harness: StreamHarness) -> list[tuple[Any, ...]]:
    rows = harness.query_target(f'SELECT id, v FROM "{harness.source_name}".t')
    return sorted((Decimal(str(key)), v) for key, v in rows)


def _source(harness: StreamHarness) -> list[tuple[Any, ...]]:
    return sorted((Decimal(str(key)), v) for key, v in harness.query_source("SELECT id, v FROM t"))


def test_a_key_whose_scale_changed_is_the_same_key_in_a_postgres_destination(harness: StreamHarness) -> None:
    harness.source.execute(TABLE)
    _catalog(harness, "postgres")
    first = _figures(harness.materialize())
    assert first["passed"] and first["buckets differing"] == 0, first  # 2.50, 100, 0.000 read back as they are
    harness.source.execute(NEW_SCALE)  # equal in PostgreSQL: the target's row 1.0 takes the new version
    figures = _figures(harness.materialize())  # no false gap, nothing owed
    assert figures["passed"] and figures["missing in target"] == 0, figures
    assert figures["in target only (deleted at the source)"] == 0 and "owed" not in figures, figures
    assert _target(harness) == _source(harness)

    # a real gap is still found and repaired by key: a row committed behind the checkpoint
    harness.source.execute("INSERT INTO t VALUES (7.50, 'late', '2024-01-01 00:00:05.5+00')")
    _catalog(harness, "postgres", {"full_every_seconds": 0, "deletes": "hard"})
    harness.source.execute("DELETE FROM t WHERE id = 2.5")  # and a real delete, applied by value
    figures = _figures(harness.materialize())
    assert figures["passed"], figures
    assert figures["read again by key (repaired)"] == 1 and figures["sample of repaired keys"] == ["7.5"], figures
    assert figures["missing in target"] == 0 and "owed" not in figures, figures
    assert figures["sample of keys deleted at the source"] == ["2.5"] and figures["deletions applied"] == 1, figures
    assert _target(harness) == _source(harness)
    again = _figures(harness.materialize())
    assert again["passed"] and again["buckets differing"] == 0, again


def test_a_key_whose_scale_changed_is_a_changed_key_in_duckdb(harness: StreamHarness) -> None:
    """DuckDB holds the key as PostgreSQL's text: 1.00 is a new row there and 1.0 one gone from the source,
    reported as such (README: a changed key is a delete), never as equal and never as missing."""
    harness.source.execute(TABLE)
    _catalog(harness, "duckdb", {"full_every_seconds": 0, "deletes": "report"})
    first = _figures(harness.materialize())
    assert first["passed"] and first["buckets differing"] == 0, first
    harness.source.execute(NEW_SCALE)
    figures = _figures(harness.materialize())
    assert figures["missing in target"] == 0 and figures["older in target than in source"] == 0, figures
    assert figures["in target only (deleted at the source)"] == 1, figures
    assert figures["sample of keys deleted at the source"] == ["1.0"], figures
    texts = harness.query_target(f"SELECT id FROM \"{harness.source_name}\".t WHERE id LIKE '1.0%' ORDER BY 1")
    assert texts == [("1.0",), ("1.00",)]

    _catalog(harness, "duckdb", {"full_every_seconds": 0, "deletes": "hard"})
    applied = _figures(harness.materialize())
    assert applied["passed"] and applied["deletions applied"] == 1, applied
    assert _target(harness) == _source(harness)


VERSIONED = """
CREATE TABLE t (id int PRIMARY KEY, v text NOT NULL, version numeric NOT NULL);
INSERT INTO t VALUES (1, 'a', 5.0), (2, 'b', 9.5), (3, 'c', 10);
"""


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_a_numeric_cursor_orders_by_value_in_the_comparison(harness: StreamHarness, destination: str) -> None:
    """A late row behind the checkpoint (9.6 < 10, though '9.6' > '10' as text) is missing, not "not yet
    synced"; a version that changed only its scale (5.0 -> 5.00) is older in the target, not equal."""
    harness.source.execute(VERSIONED)
    _catalog(harness, destination, {"full_every_seconds": 0}, cursor="version")
    first = _figures(harness.materialize())
    assert first["passed"] and first["buckets differing"] == 0, first
    harness.source.execute("INSERT INTO t VALUES (4, 'late', 9.6); UPDATE t SET version = 5.00, v = 'A' WHERE id = 1")
    figures = _figures(harness.materialize())
    assert figures["passed"] and figures["not yet synced (past the checkpoint)"] == 0, figures
    assert figures["read again by key (repaired)"] == 2, figures
    assert sorted(figures["sample of repaired keys"]) == ["1", "4"], figures
    rows = harness.query_target(f'SELECT id, v, CAST(version AS VARCHAR) FROM "{harness.source_name}".t ORDER BY id')
    assert rows == [(1, "A", "5.00"), (2, "b", "9.5"), (3, "c", "10"), (4, "late", "9.6")]
    again = _figures(harness.materialize())
    assert again["passed"] and again["buckets differing"] == 0, again


def test_a_parked_row_with_a_numeric_key_is_not_missing(harness: StreamHarness) -> None:
    """The dead-letter table names the key as the source spelled it (7.50); the comparison's key is 7.5."""
    harness.source.execute(
        "CREATE TABLE t (id numeric PRIMARY KEY, amount numeric(6,2), updated_at timestamptz NOT NULL);"
        "INSERT INTO t VALUES (1.0, 1, '2024-01-01 00:00:01+00'), (7.50, 'NaN', '2024-01-01 00:00:02+00'),"
        " (8.00, 2, '2024-01-01 00:00:03+00')"
    )
    _catalog(harness, "postgres", {"full_every_seconds": 0})
    figures = _figures(harness.materialize())
    assert figures["passed"] and figures["parked as dead letters"] == 1, figures
    assert figures["missing in target"] == 0 and "owed" not in figures, figures


LATE_UPDATES = """
CREATE TABLE t (id int PRIMARY KEY, v text NOT NULL, version numeric NOT NULL);
INSERT INTO t VALUES (1, 'a', 9.5), (2, 'b', -9.5), (3, 'c', 0.5), (4, 'd', 'NaN'), (5, 'e', 99), (6, 'f', '-Infinity');
"""
# Each a newer value behind the checkpoint (NaN, the highest numeric) whose text sorts at or below the old one's
# ('10' < '9.5', '-1' < '-9.5', '100' < '99', '-5' < '-Infinity'); 0.5 -> 0.55 sorts alike either way.
LATE = (
    "UPDATE t SET version = 10, v = 'A' WHERE id = 1; UPDATE t SET version = -1, v = 'B' WHERE id = 2;"
    "UPDATE t SET version = 0.55, v = 'C' WHERE id = 3; UPDATE t SET version = 100, v = 'E' WHERE id = 5;"
    "UPDATE t SET version = -5, v = 'F' WHERE id = 6"
)


@pytest.mark.parametrize("cursor", [["version"], ["version", "id"]], ids=["one-column", "two-columns"])
@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_a_late_update_to_a_numeric_cursor_is_repaired_under_the_version_guard(
    harness: StreamHarness, destination: str, cursor: list[str]
) -> None:
    """The repair's version guard compares a numeric cursor's values, not its texts (one cursor column: the
    target's raw text, compared by value; several: their sortable text): the rows are replaced and nothing stays
    owed (it was refused as "older than the target" on every run)."""
    harness.source.execute(LATE_UPDATES)
    _catalog(harness, destination, {"full_every_seconds": 0}, cursor=cursor)
    first = _figures(harness.materialize())
    assert first["passed"] and first["buckets differing"] == 0, first
    harness.source.execute(LATE)
    figures = _figures(harness.materialize())
    assert figures["passed"] and "owed" not in figures, str(figures)
    assert sorted(figures["sample of repaired keys"]) == ["1", "2", "3", "5", "6"], figures
    rows = harness.query_target(f'SELECT id, v, CAST(version AS VARCHAR) FROM "{harness.source_name}".t ORDER BY id')
    expected = [(1, "A", "10"), (2, "B", "-1"), (3, "C", "0.55"), (4, "d", "NaN"), (5, "E", "100"), (6, "F", "-5")]
    assert rows == expected
    again = _figures(harness.materialize())
    assert again["passed"] and again["buckets differing"] == 0 and "owed" not in again, again


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_a_numeric_cursor_bounds_the_window_by_value_on_the_target(harness: StreamHarness, destination: str) -> None:
    """The window a run read (9.5 up to 12) holds the same rows on both sides: the target's versions are bounded
    by value (as text, '9.5' <= v <= '12' held none of them, and every check fell back to a key-by-key diff)."""
    harness.source.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text NOT NULL, version numeric NOT NULL);"
        "INSERT INTO t VALUES (1, 'a', 8), (2, 'b', 9.5)"
    )
    _catalog(harness, destination, cursor="version")
    first = _figures(harness.materialize())
    assert first["passed"] and first["buckets differing"] == 0, first
    harness.source.execute("INSERT INTO t VALUES (3, 'c', 9.7), (4, 'd', 10), (5, 'e', 12), (6, 'f', -1)")
    second = _figures(harness.materialize())  # -1 is behind the checkpoint, outside the window: not compared
    assert second["passed"] and second["buckets differing"] == 0, str(second)
    assert second["source rows compared"] == second["target rows compared"] == 4, str(second)
    harness.source.execute("INSERT INTO t VALUES (7, 'g', 95), (8, 'h', 100.5)")
    third = _figures(harness.materialize())
    assert third["passed"] and third["buckets differing"] == 0, str(third)
    assert third["source rows compared"] == third["target rows compared"] == 3, str(third)
