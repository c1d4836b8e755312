"""Commit-to-target latency of polled tables and APIs: a row's cursor value, when it is a time the source
stamped the row with (timestamptz, an ISO time with an offset), against the moment its slice's load returned,
recorded in the run's HDR histogram (observe/freshness.py)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from hdrh.histogram import HdrHistogram

from ingestion_assets.observe.freshness import HIGHEST_MS, HISTOGRAM, LOWEST_MS, empty, encode

MEASURED_TO = "freshness_measured_to"  # checkpoint detail: the newest cursor time already measured (ISO)
_EPOCH = dt.datetime.fromtimestamp(0, dt.UTC)
_SUB_BUCKET_MAGNITUDE = 10  # HDR with 3 significant digits: 2048 sub-buckets, 1024 per power of two above


@dataclass
class CommitLatency:
    """One run's latencies. Rows at or before `measured_to` were measured by an earlier run (a re-read behind
    a held-back checkpoint, a lookback, a refresh) and are skipped; with no `measured_to` yet (a first load,
    whose rows are history, not lag) nothing is recorded and the run only sets it."""

    cursor: str | None
    measured_to: dt.datetime | None
    histogram: HdrHistogram = field(default_factory=empty)
    newest: dt.datetime | None = None

    @classmethod
    def for_stream(cls, cursor: str | None, stored: dict[str, Any]) -> CommitLatency:
        found = stored.get(MEASURED_TO)
        return cls(cursor, dt.datetime.fromisoformat(found) if isinstance(found, str) else None)

    def observe(self, rows: pa.Table | list[dict[str, Any]], committed_at: dt.datetime) -> None:
        """After the slice's load returned: the destination holds these rows from `committed_at` on."""
        if self.cursor is None:
            return
        micros = _arrow_micros(rows, self.cursor) if isinstance(rows, pa.Table) else _record_micros(rows, self.cursor)
        if micros is not None:  # ±infinity (the int64 extremes) and years past 9999 are no moment of commit
            micros = micros.filter(pc.and_(pc.greater_equal(micros, _FIRST), pc.less_equal(micros, _LAST)))
        if micros is None or len(micros) == 0:
            return
        newest = _EPOCH + dt.timedelta(microseconds=pc.max(micros).as_py())
        self.newest = newest if self.newest is None or newest > self.newest else self.newest
        if self.measured_to is None:
            return
        fresh = micros.filter(pc.greater(micros, _to_micros(self.measured_to)))
        if len(fresh):
            record_counts(self.histogram, pc.divide(pc.subtract(_to_micros(committed_at), fresh), 1000))

    def finish(self, details: dict[str, Any], figures: dict[str, Any]) -> None:
        """Into the run's final checkpoint (how far rows were measured) and its figures (the histogram)."""
        newest = max((t for t in (self.newest, self.measured_to) if t is not None), default=None)
        if newest is not None:
            details[MEASURED_TO] = newest.isoformat()
        if self.histogram.get_total_count():
            figures[HISTOGRAM] = encode(self.histogram)


def record_counts(histogram: HdrHistogram, latency_ms: pa.Array) -> None:
    """Record many values at once: each rounded down to its HDR bucket's lowest value (which HDR does anyway),
    then one `record_value(value, count)` per distinct bucket: a million rows cost a few thousand calls."""
    values = pc.min_element_wise(pc.max_element_wise(pc.cast(latency_ms, pa.int64()), LOWEST_MS), HIGHEST_MS)
    magnitude = pc.cast(pc.floor(pc.log2(pc.cast(values, pa.float64()))), pa.int64())
    shift = pc.max_element_wise(pc.subtract(magnitude, _SUB_BUCKET_MAGNITUDE), 0)
    lowest = pc.shift_left(pc.shift_right(values, shift), shift)
    for entry in pc.value_counts(lowest).to_pylist():
        histogram.record_value(int(entry["values"]), int(entry["counts"]))


def _arrow_micros(table: pa.Table, cursor: str) -> pa.Array | None:
    if cursor not in table.column_names:
        return None
    column = table.column(cursor)
    if not pa.types.is_timestamp(column.type) or column.type.tz is None:
        return None  # a number, a date or a local time: not a moment the row was committed
    return pc.cast(pc.cast(column, pa.timestamp("us", tz="UTC")), pa.int64()).combine_chunks().drop_null()


def _record_micros(records: list[dict[str, Any]], cursor: str) -> pa.Array | None:
    found = []
    for record in records:
        value = record.get(cursor) if isinstance(record, dict) else None
        moment = _moment(value)
        if moment is not None:
            found.append(_to_micros(moment))
    return pa.array(found, pa.int64()) if found else None


def _moment(value: Any) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo is not None else None
    if not isinstance(value, str):
        return None
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def _to_micros(moment: dt.datetime) -> int:
    delta = moment - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


_FIRST = _to_micros(dt.datetime.min.replace(tzinfo=dt.UTC))
_LAST = _to_micros(dt.datetime.max.replace(tzinfo=dt.UTC))
