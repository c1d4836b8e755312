"""Rows of a time-partitioned table that no window reads (before the first window, NULL, future-dated) are
counted and said by the runs, and keep `ingest status` needing attention until they are gone (found by a
README-only attack: every run, check and status said ok while they never loaded)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from ingestion_assets.catalog import load_catalog
from ingestion_assets.checks import check_catalog
from ingestion_assets.observe.status import ATTENTION, stream_statuses
from ingestion_assets.streams import outside_windows
from ingestion_assets_tests.helpers import StreamHarness


def _status(harness: StreamHarness) -> Any:
    (found,) = stream_statuses(harness.settings, load_catalog(harness.settings.catalog_path), harness.instance)
    return found


def _metadata(harness: StreamHarness, result: Any) -> dict[str, Any]:
    (event,) = result.asset_materializations_for_node(f"{harness.source_name}__events")
    return {k: v.value for k, v in event.metadata.items()}


def test_rows_in_no_time_window_are_counted_said_and_keep_status_needing_attention(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    today = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    yesterday = today - dt.timedelta(days=1)
    harness.source.execute(
        "CREATE TABLE events (id int PRIMARY KEY, v text, updated_at timestamptz);"
        "CREATE INDEX ON events (updated_at);"
        "INSERT INTO events VALUES "
        f"(1, 'in yesterday', '{(yesterday + dt.timedelta(hours=3)).isoformat()}'),"
        f"(2, 'in today', '{today.isoformat()}'),"
        f"(3, 'before start', '{(yesterday - dt.timedelta(days=20)).isoformat()}'),"
        f"(4, 'older still', '{(yesterday - dt.timedelta(days=40)).isoformat()}'),"
        "(5, 'no time', NULL),"
        "(6, 'future', '2030-01-01 00:00:00+00')"
    )
    partitions = {"by": "time", "column": "updated_at", "start": yesterday.date().isoformat(), "granularity": "daily"}
    harness.write_catalog(
        {"events": {"table": "events", "primary_key": "id", "cursor": "updated_at", "partitions": partitions}}
    )
    newest = today.date().isoformat()
    notes: list[str] = []  # `ingest check` fails on rows that would never load, notes the future-dated ones
    (problem,) = check_catalog(harness.settings, load_catalog(harness.settings.catalog_path), notes)
    assert "2 row(s) with updated_at before the first window's start" in problem and "(NULL)" in problem

    metadata = _metadata(harness, harness.materialize(partition=newest))
    assert metadata["rows in no window"] == 4
    said = metadata["rows in no window: why"]
    assert "2 row(s) with updated_at before the first window's start" in said and "move the partitions' `start`" in said
    assert "1 row(s) with no updated_at (NULL)" in said and "1 row(s) with updated_at at or past" in said
    checkpoint = harness.checkpoint("events", newest)
    assert checkpoint is not None
    counted = checkpoint.details["outside_windows"]
    assert (counted["before"], counted["null"], counted["after"]) == (2, 1, 1)
    assert counted["earliest"].startswith((yesterday - dt.timedelta(days=40)).date().isoformat())
    assert counted["latest"].startswith("2030-01-01")

    status = _status(harness)
    assert status.status in ATTENTION and status.status != "ok"
    assert "never load" in status.detail and "events" in status.stream

    # an older window's run counts them too (an index leads with the column): the newest count is what status shows
    harness.materialize(partition=yesterday.date().isoformat())
    assert harness.checkpoint("events", yesterday.date().isoformat()).details["outside_windows"]["before"] == 2
    harness.source.execute("UPDATE events SET updated_at = now() WHERE id IN (3, 4, 5)")  # moved into today
    harness.materialize(partition=newest)
    status = _status(harness)
    assert status.status == "ok"  # only the future-dated row is left: its window comes later, then it loads
    assert status.outside_windows is not None and "future-dated" in status.outside_windows
    loaded = harness.query_target(f'SELECT id FROM "{harness.source_name}".events ORDER BY id')
    assert loaded == [(1,), (2,), (3,), (4,), (5,)]
    notes.clear()
    assert check_catalog(harness.settings, load_catalog(harness.settings.catalog_path), notes) == []
    assert any("are future-dated" in note for note in notes), notes

    # without an index on the column an older window's run does not scan the table for them; the newest one does
    harness.source.execute("DROP INDEX events_updated_at_idx")
    harness.materialize(partition=yesterday.date().isoformat())
    assert "outside_windows" not in harness.checkpoint("events", yesterday.date().isoformat()).details
    counted = harness.checkpoint("events", newest).details["outside_windows"]
    harness.source.execute("INSERT INTO events VALUES (7, 'no time either', NULL)")
    harness.materialize(partition=newest)  # a schedule may run it every minute: a scan at most once per RECOUNT
    assert harness.checkpoint("events", newest).details["outside_windows"] == counted
    monkeypatch.setattr(outside_windows, "RECOUNT", dt.timedelta(0))
    harness.materialize(partition=newest)
    assert harness.checkpoint("events", newest).details["outside_windows"]["null"] == 1
    assert _status(harness).status in ATTENTION
