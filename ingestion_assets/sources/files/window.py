"""A partition's row window over a file's column: the rows inside it kept, rows with no value parked (they
belong to no partition), as are, by the first window, rows before it (no window holds them), and Parquet row
groups whose min/max statistics exclude the window skipped unread."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ingestion_assets.sources.files.pieces import ROW, BadRow, CorruptFile, RowWindow, without_texts


def within(table: pa.Table, window: RowWindow) -> tuple[pa.Table, list[BadRow]]:
    """The rows of `table` in the window; rows whose column is null (or not a time) become bad rows."""
    if window.column not in table.column_names:
        raise CorruptFile(f"has no column {window.column!r}, by which the stream's partitions place each row")
    values = _as_time(table.column(window.column), window)
    if values.type != table.schema.field(window.column).type:  # ISO texts (JSON lines): the times they say
        table = table.set_column(table.schema.get_field_index(window.column), window.column, values)
    low, high = (_scalar(v, values.type) for v in (window.low, window.high))
    inside = pc.and_(pc.greater_equal(values, low), pc.less(values, high))
    missing = pc.is_null(inside)
    bad = _parked(table.filter(missing), window, "the row belongs to no partition") if pc.any(missing).as_py() else []
    if window.first:  # before every window: no partition would ever read it (found by a README-only attack)
        before = pc.fill_null(pc.less(values, low), False)
        if pc.any(before).as_py():
            why = (
                f"before the first partition's window ({window.low.isoformat()}): the row belongs to no partition "
                "(move the partitions' `start` back and run the new windows: they read it; then discard this one)"
            )
            bad += _parked(table.filter(before), window, why)
    return table.filter(pc.fill_null(inside, False)), bad


def _parked(lost: pa.Table, window: RowWindow, why: str) -> list[BadRow]:
    rows, raws = lost.column(ROW).to_pylist(), without_texts(lost.drop_columns([ROW])).to_pylist()
    return [
        BadRow(row, None, f"column {window.column!r} is {raw.get(window.column)!r}: {why}", repr(raw))
        for row, raw in zip(rows, raws, strict=True)
    ]


def excluded(parquet: pq.ParquetFile, group: int, window: RowWindow) -> bool:
    """True when the row group's statistics prove none of its rows is in the window (and none is null)."""
    names = parquet.schema_arrow.names
    if window.column not in names:
        return False  # read it: within() then says what is wrong
    column = parquet.metadata.row_group(group).column(parquet.schema_arrow.get_field_index(window.column))
    stats = column.statistics
    if stats is None or not stats.has_min_max or stats.null_count is None or stats.null_count > 0:
        return False
    kind = parquet.schema_arrow.field(window.column).type
    if not pa.types.is_timestamp(kind) and not pa.types.is_date(kind):
        return False
    low, high = (_comparable(v, kind) for v in (window.low, window.high))
    least, most = _comparable(stats.min, kind), _comparable(stats.max, kind)
    return bool((most < low and not window.first) or least >= high)  # the first window parks the rows before it


def _as_time(values: pa.ChunkedArray, window: RowWindow) -> pa.ChunkedArray:
    kind = values.type
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        return values
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        try:
            return pc.cast(values, pa.timestamp("us", tz="UTC"))
        except pa.ArrowInvalid:
            pass
        try:  # times without a zone, or dates (JSON lines write them as text): wall times, placed as UTC
            return pc.cast(values, pa.timestamp("us"))
        except pa.ArrowInvalid as exc:
            raise CorruptFile(
                f"column {window.column!r} is not a timestamp everywhere (or mixes times with and without a zone): "
                f"{exc}"
            ) from exc
    raise CorruptFile(f"column {window.column!r} is {kind}, not a timestamp: the partitions cannot place its rows")


def _scalar(moment: dt.datetime, kind: pa.DataType) -> pa.Scalar:
    if pa.types.is_date(kind):
        return pa.scalar(moment.date(), kind)
    if kind.tz is None:  # a naive column is read as UTC
        return pa.scalar(moment.astimezone(dt.UTC).replace(tzinfo=None), kind)
    return pa.scalar(moment, kind)


def _comparable(value: Any, kind: pa.DataType) -> Any:
    """Statistics and window bounds as one comparable kind: UTC datetimes (dates at midnight)."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, dt.date):
        return dt.datetime.combine(value, dt.time(), tzinfo=dt.UTC)
    return value
