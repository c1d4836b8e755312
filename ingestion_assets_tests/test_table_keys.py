"""A table stream's primary_key must hold one row per value: the target keeps one row per key. A key no unique
index guarantees (a view, a table without constraints) is looked at on the stream's first full read (found by a
README-only attacker: a view's repeated key values loaded twice, then collapsed arbitrarily by the next merge)."""

from __future__ import annotations

import dagster as dg
import pytest

from ingestion_assets import checks
from ingestion_assets.catalog import load_catalog
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


def _check(harness: StreamHarness) -> tuple[list[str], list[str]]:
    notes: list[str] = []
    problems = checks.check_catalog(harness.settings, load_catalog(harness.settings.catalog_path), notes)
    return problems, notes


def test_ingest_check_looks_at_an_unguarded_key_and_says_what_it_did_not_look_at(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a README-only attack: `ingest check` passed a view keyed by a column that is not unique; the run
    then failed. Now check fails first, naming the values; a key an index guarantees is said to be taken as it
    is, and a look that outlasts its statement_timeout is said to be unchecked, not passed silently."""
    harness.source.execute(
        SETUP + "CREATE TABLE keyed (k int PRIMARY KEY, updated_at timestamptz NOT NULL);"
        "INSERT INTO keyed SELECT g, now() FROM generate_series(1, 300) g;"
        "CREATE VIEW slow_view AS SELECT * FROM keyed WHERE pg_sleep(0.01 + k * 0) IS NOT NULL"
    )
    name = harness.source_name
    harness.write_catalog(
        {
            "events": {"table": "events_view", "primary_key": "k", "cursor": "updated_at"},
            "pairs": {"table": "events_view", "primary_key": ["k", "sub"], "cursor": "updated_at"},
            "keyed": {"table": "keyed", "primary_key": "k", "cursor": "updated_at"},
            "slow": {"table": "slow_view", "primary_key": "k", "cursor": "updated_at"},
        }
    )
    monkeypatch.setattr(checks, "KEY_CHECK_SECONDS", 0.5)  # the view takes 3 s to read whole
    problems, notes = _check(harness)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"stream {name}.events: primary_key ['k'] is not unique in the source: 2 value(s)")
    assert "k=1 in 2 rows" in problems[0] and "k=3 in 2 rows" in problems[0]
    assert sorted(notes) == [
        f"stream {name}.keyed: primary_key ['k'] is unique by the source's own index: not looked at",
        f"stream {name}.slow: primary_key ['k'] has no unique index and its look for repeated values stopped after "
        "0.5 s (statement_timeout): not checked here; a first full read checks it before loading",
    ]
    sessions = harness.query_source("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ingest-check-key'")
    assert sessions == [(0,)]  # nothing left running on the source


def test_a_key_repeated_after_the_first_read_is_told_as_repeated_not_as_newer_in_the_target(
    harness: StreamHarness,
) -> None:
    """Rows made later that repeat a key no constraint guards are merged into one target row, the newest (README).
    The check then compared the source's older row with the target's newer one and failed every run, 'newer in
    the target', owed, with `ingest refresh` as the fix (which cannot help: the source still repeats the key)."""
    harness.source.execute(SETUP + "DELETE FROM events WHERE sub = 2")
    harness.write_catalog(
        {"events": {"table": "events", "primary_key": "k", "cursor": "updated_at", "reconcile": "full"}}
    )
    harness.materialize()
    harness.source.execute("INSERT INTO events VALUES (2, 9, '2026-12-05', 'two again')")
    result = harness.materialize()
    check = next(e for e in result.get_asset_check_evaluations() if e.check_name == "reconciliation")
    assert check.passed, check.metadata
    assert check.metadata["older rows of keys repeated at the source (the target keeps the newest)"].value == 1
    assert check.metadata["sample of keys repeated at the source"].value == ["2"]
    assert check.metadata["newer in target than in source"].value == 0
    assert harness.query_target(f'SELECT v FROM "{harness.source_name}".events WHERE k = 2') == [("two again",)]
