"""The `_ingest_*` columns every target row carries (see DESIGN.md), added to each Arrow slice."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.sources.postgres import temporal

EXTRACTED_AT = "_ingest_extracted_at"
POSITION = "_ingest_position"
GENERATION = "_ingest_generation_id"
DELETED_AT = "_ingest_deleted_at"
META = "_ingest_meta"

TIMESTAMP_UTC = pa.timestamp("us", tz="UTC")

DLT_HINTS: dict[str, dict[str, object]] = {
    EXTRACTED_AT: {"data_type": "timestamp", "timezone": True, "precision": 6, "nullable": False},
    POSITION: {"nullable": True, "dedup_sort": "desc"},  # its type follows the cursor
    GENERATION: {"data_type": "bigint", "nullable": False},
    DELETED_AT: {"data_type": "timestamp", "timezone": True, "precision": 6, "nullable": True},
    META: {"data_type": "json", "nullable": True},
}


def with_metadata(
    table: pa.Table,
    version_columns: Sequence[str],
    extracted_at: dt.datetime,
    generation: int,
    meta: pa.Array | None = None,
) -> pa.Table:
    """Append the metadata columns. The row's version is its cursor value: one cursor column is
    copied as it is (typed, zero-copy), several become sortable text; without a cursor the newest
    read is the newest version."""
    rows = table.num_rows
    extracted = pa.repeat(pa.scalar(extracted_at, TIMESTAMP_UTC), rows)
    if len(version_columns) == 1:
        position: pa.ChunkedArray | pa.Array = table.column(version_columns[0])
    elif version_columns:
        position = sortable_text([table.column(name) for name in version_columns])
    else:
        position = extracted
    return (
        table.append_column(EXTRACTED_AT, extracted)
        .append_column(POSITION, position)
        .append_column(GENERATION, pa.repeat(pa.scalar(generation, pa.int64()), rows))
        .append_column(DELETED_AT, pa.nulls(rows, TIMESTAMP_UTC))
        .append_column(META, meta if meta is not None else pa.nulls(rows, pa.string()))
    )


def sortable_text(columns: Sequence[pa.ChunkedArray | pa.Array]) -> pa.ChunkedArray | pa.Array:
    """Text whose string order equals the value order, so the newest version compares highest.

    Timestamps and dates print fixed-width ISO (UTC), integers are offset to non-negative and padded,
    NULL prints empty (lowest). Several columns join with `|`. Dates strftime cannot print keep their order
    around the four-digit years: BC after `!` (below digits), years past 9999 and infinity after `~` (above).
    """
    parts = [_sortable(column) for column in columns]
    if len(parts) == 1:
        return parts[0]
    return pc.binary_join_element_wise(*parts, "|")


def _sortable(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    kind = column.type
    if pa.types.is_timestamp(kind):
        column = pc.cast(column, pa.timestamp("us", tz=kind.tz))
        text = _far_dates(column, pc.strftime(column, format="%Y-%m-%dT%H:%M:%S"), temporal.US_PER_DAY)
    elif pa.types.is_date(kind):
        text = _far_dates(column, pc.strftime(column, format="%Y-%m-%d"), 1)
    elif pa.types.is_integer(kind):
        shifted = pc.add(pc.cast(column, pa.decimal128(20, 0)), pa.scalar(2**63, pa.decimal128(20, 0)))
        text = pc.utf8_lpad(pc.cast(shifted, pa.string()), width=20, padding="0")
    else:
        text = pc.cast(column, pa.string())
    return pc.fill_null(text, "")


_YEARS_1_TO_9999 = (temporal.days_from_civil(1, 1, 1), temporal.days_from_civil(10000, 1, 1))


def _far_dates(column: pa.ChunkedArray | pa.Array, text: pa.ChunkedArray | pa.Array, unit: int) -> pa.Array:
    values = pc.cast(column, pa.int32() if unit == 1 else pa.int64())
    low, high = (days * unit for days in _YEARS_1_TO_9999)
    far = pc.fill_null(pc.or_(pc.less(values, low), pc.greater_equal(values, high)), False)
    if not pc.any(far).as_py():
        return text
    integers, texts = values.to_pylist(), text.to_pylist()
    for index in pc.indices_nonzero(far).to_pylist():
        texts[index] = temporal.sortable(integers[index], unit)
    return pa.array(texts, pa.string())
