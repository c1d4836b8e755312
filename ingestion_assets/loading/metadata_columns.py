"""The `_ingest_*` columns every target row carries (see DESIGN.md), added to each Arrow slice."""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Collection, Sequence
from decimal import ROUND_FLOOR, Decimal

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.loading.number_order import number_order
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
    numbers: Collection[str] = (),
) -> pa.Table:
    """Append the metadata columns. The row's version is its cursor value: one cursor column is
    copied as it is (typed, zero-copy; a numeric's text is compared by value where versions are compared,
    see TargetTable.numeric_position), several become sortable text (`numbers`: the cursor columns holding a
    numeric's text); without a cursor the newest read is the newest version."""
    rows = table.num_rows
    extracted = pa.repeat(pa.scalar(extracted_at, TIMESTAMP_UTC), rows)
    if len(version_columns) == 1:
        position: pa.ChunkedArray | pa.Array = table.column(version_columns[0])
    elif version_columns:
        columns = [table.column(name) for name in version_columns]
        position = sortable_text(columns, [name in numbers for name in version_columns])
    else:
        position = extracted
    return (
        table.append_column(EXTRACTED_AT, extracted)
        .append_column(POSITION, position)
        .append_column(GENERATION, pa.repeat(pa.scalar(generation, pa.int64()), rows))
        .append_column(DELETED_AT, pa.nulls(rows, TIMESTAMP_UTC))
        .append_column(META, meta if meta is not None else pa.nulls(rows, pa.string()))
    )


def sortable_text(
    columns: Sequence[pa.ChunkedArray | pa.Array], numeric: Sequence[bool] = ()
) -> pa.ChunkedArray | pa.Array:
    """Text whose byte order equals the value order, so the newest version compares highest.

    Timestamps and dates print fixed-width ISO (UTC); integers, floats and decimals as digits of fixed width
    (offset to non-negative); a numeric's text (`numeric`: per column) as number_order's, ended by `!`, below
    its digits; a NULL prints as a space, below every value of these. Dates strftime cannot
    print keep their order around the four-digit years: BC after `!` (below digits), years past 9999 and
    infinity after `~` (above). Other values print as text that ends in \\x01\\x02 (a \\x01 inside is
    escaped), NULL as \\x01\\x01: no text is then a prefix of another, so a short text cannot sort above a
    longer one by what follows it. Parts join with `|`. DuckDB compares these bytes as they are; PostgreSQL
    compares them with COLLATE "C" (see versions.py).
    """
    numeric = list(numeric) or [False] * len(columns)
    parts = [_number_part(c) if n else _sortable(c) for c, n in zip(columns, numeric, strict=True)]
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
        text = _padded(column)
    elif pa.types.is_floating(kind):
        text = _padded(_float_order(column))
    elif pa.types.is_decimal(kind):
        text = _decimal_order(column)
    else:
        escaped = pc.replace_substring(pc.cast(column, pa.string()), "\x01", "\x01\x03")
        return pc.fill_null(pc.binary_join_element_wise(escaped, "", "\x01\x02"), "\x01\x01")
    return pc.fill_null(text, " ")


def _number_part(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    texts = [None if t is None else number_order(t) + "!" for t in column.to_pylist()]
    return pc.fill_null(pa.array(texts, pa.string()), " ")


def version_text(value: object) -> str | None:
    """An API record's version as text that orders as the value (dlt keeps the highest of one key's versions
    in a slice): numbers print fixed-width as in sortable_text, so version 10 is above 9; an exact decimal (a
    number with a point) as its floor so, then `.` and its fraction's digits, so 9.5 lies between 9 and 10;
    texts as they are."""
    if isinstance(value, bool) or value is None:
        return None if value is None else str(value)
    if isinstance(value, float):
        value = _float_bits(value)
    whole, fraction = value, ""
    if isinstance(value, Decimal) and value.is_finite():
        whole = int(value.to_integral_value(rounding=ROUND_FLOOR))
        digits = format(value - whole, "f").partition(".")[2].rstrip("0")
        fraction = "." + digits if digits else ""
    if isinstance(whole, int) and -(2**63) <= whole < 2**63:
        return str(whole + 2**63).zfill(20) + fraction
    return str(value)


def _padded(integers: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """Signed 64-bit integers as 20 digits, offset to non-negative: text order is number order."""
    shifted = pc.add(pc.cast(integers, pa.decimal128(20, 0)), pa.scalar(2**63, pa.decimal128(20, 0)))
    return pc.utf8_lpad(pc.cast(shifted, pa.string()), width=20, padding="0")


def _float_order(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A float's IEEE bits as a signed integer whose order is the float's (negative values flipped; NaN above
    infinity, as PostgreSQL orders it). Per value: a float among several cursor columns is rare."""
    values = pc.cast(column, pa.float64()).to_pylist()
    return pa.array([None if value is None else _float_bits(value) for value in values], pa.int64())


def _float_bits(value: float) -> int:
    bits: int = struct.unpack("<q", struct.pack("<d", value))[0]
    return bits if bits >= 0 else bits ^ 0x7FFFFFFFFFFFFFFF


def _decimal_order(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A decimal's unscaled integer offset by 10^38 (beyond any decimal128), as 39 digits."""
    scale = column.type.scale
    texts = [None if v is None else str(int(v.scaleb(scale)) + 10**38).zfill(39) for v in column.to_pylist()]
    return pa.array(texts, pa.string())


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
