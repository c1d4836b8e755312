"""Which files (and rows) a partition of a file stream reads: the files whose path names a moment in its time
window or a number in its key range, and, with a partition `column`, the rows whose value is in the window."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from ingestion_assets.catalog import FilesStream, PathKeyPartitions, PathTimePartitions
from ingestion_assets.partitions import UnknownPartition, key_range, time_window, windows_span
from ingestion_assets.sources.files import FileInfo
from ingestion_assets.sources.files.paths import path_moment, path_number
from ingestion_assets.sources.files.pieces import RowWindow


@dataclass(frozen=True)
class PartitionScope:
    """A partition's part of the stream; the whole stream for an unpartitioned one (or no partition given)."""

    partitions: PathTimePartitions | PathKeyPartitions | None
    key: str | None

    @classmethod
    def of(cls, spec: FilesStream, partition: str | None) -> PartitionScope:
        scope = cls(spec.partitions, partition)
        scope.bounds()  # an unknown key fails before anything is listed
        return scope

    def bounds(self) -> tuple[dt.datetime, dt.datetime] | tuple[int, int] | None:
        partitions = self.partitions
        if partitions is None or self.key is None:
            return None
        if isinstance(partitions, PathTimePartitions):
            return time_window(partitions, self.key)
        low, high = key_range(self.key)
        return low, high + 1

    def holds(self, relative: str) -> bool:
        """Whether the file at `relative` belongs to this partition (files matching no pattern: to none)."""
        partitions, bounds = self.partitions, self.bounds()
        if partitions is None or bounds is None:
            return True
        if isinstance(partitions, PathTimePartitions):
            if partitions.pattern is None:  # partitioned by a column: every file may hold rows of the window
                return True
            moment = path_moment(partitions.pattern, relative)
            return moment is not None and bounds[0] <= moment < bounds[1]  # type: ignore[operator]
        number = path_number(partitions.pattern, relative)
        return number is not None and bounds[0] <= number < bounds[1]  # type: ignore[operator]

    def select(self, files: list[FileInfo], name: dict[str, str]) -> list[FileInfo]:
        return [f for f in files if self.holds(name[f.path])]

    def rows(self) -> RowWindow | None:
        """The rows the partition keeps, when its partitions bound a column."""
        partitions, bounds = self.partitions, self.bounds()
        if not isinstance(partitions, PathTimePartitions) or partitions.column is None or bounds is None:
            return None
        first = bounds[0] <= windows_span(partitions, dt.datetime.now(dt.UTC))[0]  # type: ignore[operator]
        return RowWindow(partitions.column, bounds[0], bounds[1], first=first)


def window_sql(client: Any, column: str, window: RowWindow) -> str:
    """SQL: the target's `column` (as the target names it) in the window, as the read places rows (a time without a
    zone read as UTC, a date at its midnight): its seconds since 1970 in the target's own terms, whatever the
    column's type and the session's time zone. MySQL and MariaDB count microseconds from 1970 by TIMESTAMPDIFF
    (their DATETIME has no zone)."""
    quoted = client.escape_column_name(column)
    low, high = window.low.timestamp(), window.high.timestamp()
    if getattr(client, "dialect_name", None) in ("mysql", "mariadb"):
        since = f"TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {quoted})"
        return f"{since} >= {round(low * 1_000_000)} AND {since} < {round(high * 1_000_000)}"
    return f"EXTRACT(EPOCH FROM {quoted}) >= {low!r} AND EXTRACT(EPOCH FROM {quoted}) < {high!r}"


def path_numbers(spec: FilesStream, relatives: list[str]) -> list[int]:
    """The numbers the files' paths name at the key pattern (to plan key-range partitions from a listing)."""
    partitions = spec.partitions
    if not isinstance(partitions, PathKeyPartitions):
        raise UnknownPartition("this stream has no key partitions by path")
    return [n for n in (path_number(partitions.pattern, r) for r in relatives) if n is not None]


def unplaced(spec: FilesStream, relatives: list[str]) -> list[str]:
    """Files the stream's glob finds but no partition reads: their path does not match the pattern, or names a
    moment before the first window, which may start after `start` (`ingest check` names them: they would never load)."""
    partitions = spec.partitions
    if partitions is None or partitions.pattern is None:
        return []
    if isinstance(partitions, PathKeyPartitions):
        return [r for r in relatives if path_number(partitions.pattern, r) is None]
    start = windows_span(partitions, dt.datetime.now(dt.UTC))[0]  # weekly: a Sunday, monthly: the 1st
    moments = {r: path_moment(partitions.pattern, r) for r in relatives}
    return [r for r, moment in moments.items() if moment is None or moment < start]
