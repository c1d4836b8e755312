"""Partition keys and their read windows: every key in exactly one range, time windows in UTC."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingestion_assets.catalog import PostgresStream
from ingestion_assets.partitions import (
    LIVE,
    UnknownPartition,
    key_range,
    key_range_keys,
    key_ranges_below,
    time_window,
    window_for,
)
from ingestion_assets.sources.postgres.query import Window


def _stream(partitions: dict[str, object]) -> PostgresStream:
    return PostgresStream(table="t", primary_key=["id"], cursor=["updated_at"], partitions=partitions)


def test_key_windows_are_half_open_and_live_reads_everything() -> None:
    stream = _stream({"by": "key", "chunk": 1000})
    assert window_for(stream, "2000-2999") == Window("id", "2000", "3000")
    assert window_for(stream, LIVE) is None
    with pytest.raises(UnknownPartition):
        window_for(stream, "2024-01-01")


@pytest.mark.parametrize(
    ("granularity", "key", "end"),
    [
        ("daily", "2024-02-28", "2024-02-29T00:00:00+00:00"),
        ("weekly", "2024-12-29", "2025-01-05T00:00:00+00:00"),
        ("monthly", "2024-12-01", "2025-01-01T00:00:00+00:00"),
        ("hourly", "2024-03-31-23:00", "2024-04-01T00:00:00+00:00"),
    ],
)
def test_time_windows(granularity: str, key: str, end: str) -> None:
    stream = _stream({"by": "time", "column": "updated_at", "start": "2024-01-01", "granularity": granularity})
    window = window_for(stream, key)
    assert window is not None and window.upper == end
    assert time_window(stream.partitions, key)[0].tzinfo == dt.UTC  # type: ignore[arg-type]


@given(
    low=st.integers(-5_000, 5_000),
    span=st.integers(0, 50_000),
    chunk=st.integers(1, 7_000),
    new_chunk=st.integers(1, 7_000),
    growth=st.integers(0, 30_000),
    shrink=st.integers(0, 9_000),
)
def test_replanning_with_any_chunk_leaves_no_gap_and_no_overlap(
    low: int, span: int, chunk: int, new_chunk: int, growth: int, shrink: int
) -> None:
    high = low + span
    first = key_range_keys(low, high, chunk)
    lowest = min(key_range(k)[0] for k in first)
    highest = max(key_range(k)[1] for k in first)
    new_low, new_high = low - shrink, high + growth
    more = key_ranges_below(new_low, lowest, new_chunk) + key_range_keys(new_low, new_high, new_chunk, after=highest)
    ranges = sorted(key_range(k) for k in first + more)
    assert ranges[0][0] <= new_low and ranges[-1][1] >= new_high
    for (_, end), (start, _) in itertools.pairwise(ranges):
        assert start == end + 1  # contiguous: every key in exactly one range


def test_the_demo_backfills_key_ranges_in_runs_around_live() -> None:
    """A range run refuses to take in `live` unnamed: the demo's history runs stop on each side of it."""
    from ingestion_assets.cli.demo_runs import _around_live

    assert _around_live(["0-9", "10-19", LIVE, "20-29"]) == [["0-9", "10-19"], ["20-29"]]
    assert _around_live(["0-9", LIVE]) == [["0-9"]]
    assert _around_live([LIVE]) == []


@pytest.mark.parametrize("granularity", ["hourly", "daily", "weekly", "monthly"])
@pytest.mark.parametrize("start", ["2025-12-31", "2026-02-01", "2026-03-04", "2026-03-08"])
def test_the_windows_span_is_where_dagster_lays_the_first_and_newest_windows(granularity: str, start: str) -> None:
    """Weekly windows start on a Sunday, monthly ones on the 1st: the first may start after `start`, and rows between
    are in no window (counted by the runs as before the first window)."""
    import dagster as dg

    from ingestion_assets.catalog import TimePartitions
    from ingestion_assets.defs.partitions import partitions_def
    from ingestion_assets.partitions import windows_span

    spec = PostgresStream.model_validate(
        {
            "table": "t",
            "primary_key": "id",
            "partitions": {"by": "time", "column": "at", "start": start, "granularity": granularity},
        }
    )
    assert isinstance(spec.partitions, TimePartitions)
    laid = partitions_def("s", "t", spec)
    assert isinstance(laid, dg.TimeWindowPartitionsDefinition)
    keys = laid.get_partition_keys()
    first, newest = laid.time_window_for_partition_key(keys[0]), laid.time_window_for_partition_key(keys[-1])
    assert windows_span(spec.partitions, dt.datetime.now(dt.UTC)) == (first.start, newest.end)
