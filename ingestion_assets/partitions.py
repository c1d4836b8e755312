"""Partition keys and the read window each one stands for (time windows, integer key ranges, `live`)."""

from __future__ import annotations

import datetime as dt
import re
from typing import TYPE_CHECKING

from ingestion_assets.catalog import KeyPartitions, PathTimePartitions, PostgresStream, TimePartitions

if TYPE_CHECKING:  # the readers' package imports dlt: the definitions use the keys, not the windows
    from ingestion_assets.sources.postgres.query import Window

LIVE = "live"
KEY_FORMATS = {"hourly": "%Y-%m-%d-%H:%M", "daily": "%Y-%m-%d", "weekly": "%Y-%m-%d", "monthly": "%Y-%m-%d"}
_RANGE = re.compile(r"^(-?\d+)-(-?\d+)$")


class UnknownPartition(ValueError):
    """A partition key that does not belong to the stream's partitioning."""

    transient = False


def window_for(spec: PostgresStream, partition: str | None) -> Window | None:
    """The rows a partition reads; None reads the whole table (unpartitioned, or the live tail)."""
    from ingestion_assets.sources.postgres.query import Window

    partitions = spec.partitions
    if partitions is None or partition is None or partition == LIVE:
        if partition == LIVE and not (isinstance(partitions, KeyPartitions) and partitions.live):
            raise UnknownPartition("this stream has no `live` partition")
        return None
    column = spec.partition_column
    assert column is not None
    if isinstance(partitions, TimePartitions):
        start, end = time_window(partitions, partition)
        return Window(column, start.isoformat(), end.isoformat())
    low, high = key_range(partition)
    return Window(column, str(low), str(high + 1))


def time_window(partitions: TimePartitions | PathTimePartitions, key: str) -> tuple[dt.datetime, dt.datetime]:
    try:
        start = dt.datetime.strptime(key, KEY_FORMATS[partitions.granularity]).replace(tzinfo=dt.UTC)
    except ValueError as exc:
        raise UnknownPartition(f"{key!r} is not a {partitions.granularity} partition key") from exc
    if partitions.granularity == "hourly":
        return start, start + dt.timedelta(hours=1)
    if partitions.granularity == "daily":
        return start, start + dt.timedelta(days=1)
    if partitions.granularity == "weekly":
        return start, start + dt.timedelta(days=7)
    month = start.month % 12 + 1
    return start, start.replace(year=start.year + (start.month == 12), month=month)


def key_range(key: str) -> tuple[int, int]:
    match = _RANGE.match(key)
    if match is None:
        raise UnknownPartition(f"{key!r} is not a key range like '0-999999' (or `live`)")
    return int(match.group(1)), int(match.group(2))


def key_range_keys(low: int, high: int, chunk: int, after: int | None = None) -> list[str]:
    """Ranges of `chunk` keys covering low..high: '0-999', '1000-1999', ...

    With `after` (the end of the highest existing range) the new ranges start right after it, so they
    continue the existing ones without a gap even if `chunk` changed since.
    """
    first = after + 1 if after is not None else (low // chunk) * chunk
    return [f"{start}-{start + chunk - 1}" for start in range(first, high + 1, chunk)]


def key_ranges_below(low: int, lowest_start: int, chunk: int) -> list[str]:
    """Ranges for keys that appeared below the lowest existing range, ending right before it."""
    first = (low // chunk) * chunk
    return [f"{start}-{min(start + chunk - 1, lowest_start - 1)}" for start in range(first, lowest_start, chunk)]


def windows_span(partitions: TimePartitions | PathTimePartitions, now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """Where the first window starts and the newest (the one holding `now`) ends, as Dagster lays the windows out:
    a weekly window starts on a Sunday and a monthly one on the 1st, so the first one may start after `start`."""
    start = dt.datetime.combine(partitions.start, dt.time(), tzinfo=dt.UTC)
    hour = now.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)
    day = hour.replace(hour=0)
    if partitions.granularity == "hourly":
        return start, hour + dt.timedelta(hours=1)
    if partitions.granularity == "daily":
        return start, day + dt.timedelta(days=1)
    if partitions.granularity == "weekly":  # isoweekday: Sunday is 7
        first = start + dt.timedelta(days=(7 - start.isoweekday()) % 7)
        return first, day - dt.timedelta(days=day.isoweekday() % 7) + dt.timedelta(days=7)
    first = start if start.day == 1 else start.replace(day=1) + dt.timedelta(days=32)
    month = day.replace(day=1) + dt.timedelta(days=32)
    return first.replace(day=1), month.replace(day=1)
