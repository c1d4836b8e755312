"""A table stream's primary_key must hold one row per value: the target keeps one row per key. A key no unique
index guarantees (a view, a table without constraints) is looked at on the stream's first full read (found by a
README-only attacker: a view's repeated key values loaded twice, then collapsed arbitrarily by the next merge)."""

from __future__ import annotations

import dagster as dg

from ingestion_assets_tests.helpers import StreamHarness

SETUP = """
CREATE TABLE events (k int, sub int, updated_at timestamptz NOT NULL, v text);
INSERT INTO events VALUES (1, 1, '2026-12-01', 'one-a'), (1, 2, '2026-12-02', 'one-b'), (2, 1, '2026-12-01', 'two'),
                          (3, 1, '2026-12-01', 'three-a'), (3, 2, '2026-12-01', 'three-b'), (4, 1, '2026-12-01', NULL);
CREATE VIEW events_view AS SELECT * FROM events;
"""


def _failure(result: dg.ExecuteInProcessResult) -> str:
    assert not result.success
    event = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    return str(event.step_failure_data.error)


def test_a_key_that_several_rows_share_stops_the_first_read_naming_the_values(harness: StreamHarness) -> None:
    harness.source.execute(SETUP)
    for table in ("events", "events_view"):
        harness.write_catalog({"events": {"table": table, "primary_key": "k", "cursor": "updated_at"}})
        error = _failure(harness.materialize(raise_on_error=False))
        assert f"{harness.source_name}.events: primary_key ['k'] is not unique in the source: 2 value(s)" in error
        assert "k=1 in 2 rows" in error and "k=3 in 2 rows" in error and "nothing was loaded" in error


def test_a_key_unique_in_fact_or_by_an_index_loads(harness: StreamHarness) -> None:
    harness.source.execute(SETUP)
    harness.write_catalog({"events": {"table": "events_view", "primary_key": ["k", "sub"], "cursor": "updated_at"}})
    harness.materialize()  # no index on a view: looked at, unique
    assert len(harness.query_target(f'SELECT k FROM "{harness.source_name}".events')) == 6
    harness.source.execute("DELETE FROM events WHERE sub = 2; CREATE UNIQUE INDEX events_k ON events (k)")
    harness.write_catalog({"events": {"table": "events", "primary_key": ["k", "sub"], "cursor": "updated_at"}})
    harness.source.execute("UPDATE events SET updated_at = now()")
    harness.materialize()  # (k) is unique by its index, so (k, sub) is too: not looked at again


def test_a_partitions_first_read_looks_at_the_key_within_its_window(harness: StreamHarness) -> None:
    """Key ranges and time windows read apart: each partition's first read looks at the rows of its own window."""
    harness.source.execute(SETUP)
    key_ranges = {"by": "key", "chunk": 2}
    harness.write_catalog(
        {"events": {"table": "events_view", "primary_key": "k", "cursor": "updated_at", "partitions": key_ranges}}
    )
    assert harness.plan_partitions("events")[:3] == ["0-1", "2-3", "4-5"]
    error = _failure(harness.materialize(raise_on_error=False, partition="0-1"))
    assert "primary_key ['k'] is not unique in the source: 1 value(s)" in error and "k=1 in 2 rows" in error
    harness.materialize(partition="4-5")  # no repeated value in this window: it loads
    assert harness.query_target(f'SELECT k, v FROM "{harness.source_name}".events') == [(4, None)]

    days = {"by": "time", "column": "updated_at", "start": "2026-12-01", "granularity": "daily"}
    harness.write_catalog(
        {"events": {"table": "events_view", "primary_key": "k", "cursor": "updated_at", "partitions": days}}
    )
    error = _failure(harness.materialize(raise_on_error=False, partition="2026-12-01"))
    assert "k=3 in 2 rows" in error and "nothing was loaded" in error


def test_a_partitioned_stream_refuses_a_cursor_the_target_orders_otherwise(harness: StreamHarness) -> None:
    """The version guard of partitions compares cursor values in the target: an enum ('paid' < 'delivered' in the
    source, not in bytes) kept older versions, silently (found by a README-only attacker)."""
    harness.source.execute(
        "CREATE TYPE stage AS ENUM ('new', 'paid', 'delivered');"
        "CREATE TABLE en (id int PRIMARY KEY, st stage NOT NULL, code text COLLATE \"C\" NOT NULL, v text);"
        "INSERT INTO en SELECT g, 'new', 'c' || g, 'v' FROM generate_series(1, 10) g"
    )
    stream = {"table": "en", "primary_key": "id", "cursor": "st", "partitions": {"by": "key", "chunk": 5}}
    harness.write_catalog({"en": stream})
    harness.plan_partitions("en")
    error = _failure(harness.materialize(raise_on_error=False, partition="0-4"))
    assert "cursor st (an enum: its labels' declared order) does not compare in the target as in the source" in error
    harness.write_catalog({"en": {**stream, "cursor": "code"}})  # text in collation "C": bytes order it alike
    harness.materialize(partition="0-4")
    harness.write_catalog({"en": {**stream, "partitions": None}})  # unpartitioned: read in the source's order
    harness.materialize()
