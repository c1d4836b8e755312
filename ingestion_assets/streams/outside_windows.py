"""Rows of a table partitioned by time windows that no window reads: before the first window, future-dated (past
the newest window), or with no value in the partition column. Every run reads its own window only, so nothing
else would ever say they are there (found by a README-only attack: runs, `ingest check`, `ingest status` and
`ingest reconcile` all said ok while such rows never loaded).

A run of the newest window (the one a schedule repeats) counts them; a run of an older window too when an index
leads with the column (a few index probes). Without one the count scans the table, as each window's read already
does, so the backfill's runs leave it to the newest window's, and that one counts at most once per `RECOUNT` (a
schedule may run it every minute), keeping the last count meanwhile. The count rides in the run's final
checkpoint; `ingest status` shows the newest one."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from ingestion_assets.catalog import TimePartitions
from ingestion_assets.partitions import LIVE, time_window, windows_span

if TYPE_CHECKING:
    from ingestion_assets.sources.postgres.query import ReadPlan
    from ingestion_assets.streams.postgres_table import PostgresTableStream

OUTSIDE = "outside_windows"  # the checkpoint's record of the last count: {before, earliest, after, latest, ...}
RECOUNT = dt.timedelta(hours=1)  # without an index on the column: how long the newest window's runs keep a count


def count_outside(
    stream: PostgresTableStream,
    plan: ReadPlan,
    partition: str | None,
    stored: dict[str, Any] | None = None,
    now: dt.datetime | None = None,
) -> dict[str, Any] | None:
    """The rows no window reads, as the checkpoint keeps them: counted now, or the partition's `stored` count when
    it is younger than `RECOUNT` and a count would scan the table; None when this run does not count."""
    from ingestion_assets.sources.postgres.outside import column_indexed, rows_outside
    from ingestion_assets.sources.postgres.reader import connect

    partitions = stream.spec.partitions
    if not isinstance(partitions, TimePartitions) or partition in (None, LIVE):
        return None
    now = now or dt.datetime.now(dt.UTC)
    first, end = windows_span(partitions, now)
    newest = time_window(partitions, partition)[1] >= end
    conn = connect(stream.source_url(), "ingest-outside-windows")
    try:
        if not column_indexed(conn, stream.spec.schema_name, stream.spec.table_name, partitions.column):
            if not newest:
                return None
            kept = (stored or {}).get(OUTSIDE)
            if (
                isinstance(kept, dict)
                and _younger(kept, now - RECOUNT)
                and kept.get("newest_window_end") == end.isoformat()
            ):
                return kept
        found = rows_outside(conn, plan, partitions.column, first.isoformat(), end.isoformat())
    finally:
        conn.close()
    return {
        "before": found.before,
        "earliest": found.earliest,
        "first_window": first.isoformat(),
        "after": found.after,
        "latest": found.latest,
        "newest_window_end": end.isoformat(),
        "null": found.null,
        "column": partitions.column,
        "counted_at": now.isoformat(),
    }


def _younger(kept: dict[str, Any], than: dt.datetime) -> bool:
    try:
        return dt.datetime.fromisoformat(str(kept.get("counted_at"))) > than
    except ValueError:
        return False


def outside_text(stream_name: str, found: dict[str, Any]) -> str | None:
    """What to tell the user of the rows no window reads (None: there are none)."""
    column = found.get("column")
    said = []
    if found.get("before"):
        said.append(
            f"{found['before']:,} row(s) with {column} before the first window's start {found.get('first_window')} "
            f"(the earliest {found.get('earliest')}) are in no window and never load: move the partitions' `start` "
            "back to hold them (weekly windows start on a Sunday, monthly ones on the 1st) and run the new windows"
        )
    if found.get("null"):
        said.append(
            f"{found['null']:,} row(s) with no {column} (NULL) are in no window and never load: give them a value, or "
            "partition the stream by a column that always has one"
        )
    if found.get("after"):
        said.append(
            f"{found['after']:,} row(s) with {column} at or past the newest window's end "
            f"{found.get('newest_window_end')} (the latest {found.get('latest')}) are future-dated: no window "
            "reads them until theirs comes"
        )
    if not said:
        return None
    return f"stream {stream_name}: {'; '.join(said)}"


def never_read(found: dict[str, Any]) -> int:
    """Rows no window will ever read as things stand (a later window reads the future-dated ones)."""
    return int(found.get("before") or 0) + int(found.get("null") or 0)
