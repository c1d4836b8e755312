"""Parquet columns in types every target holds exactly: uint64 as numeric(20,0), decimals past 38 digits as their
text, dictionaries decoded, large and half-precision types in their usual width, times in microseconds. A row
whose timestamp or time has nanoseconds (or lies outside what microseconds can count) is parked, never cut."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.sources.files.pieces import ROW, BadRow

MAX_DECIMAL_DIGITS = 38  # DuckDB's widest DECIMAL, and Arrow's decimal128
_PER_UNIT = {"s": 1_000_000, "ms": 1_000}  # microseconds in a count of the unit


def fitted(table: pa.Table) -> tuple[pa.Table, list[BadRow]]:
    """`table` (with ROW) in the types targets hold; rows with a value no such type holds come back as bad rows."""
    unfit, read = pa.repeat(False, table.num_rows), table
    problems: dict[str, tuple[pa.DataType, pa.Array]] = {}
    for index, field in enumerate(table.schema):
        column = table.column(index)
        if pa.types.is_dictionary(field.type):  # its values, then as any column of their type
            field = pa.field(field.name, field.type.value_type)
            column = pc.cast(column, field.type)
            table = table.set_column(index, field, column)
        if pa.types.is_nested(field.type):
            table = table.set_column(index, pa.field(field.name, pa.string()), as_json(column))
            continue
        kind = _fit(field.type)
        if kind is None:
            continue
        exact = _exact_cast(column, field.type, kind)
        if _counts_time(field.type) and field.type.unit != "us":
            lost = _not_in_microseconds(column, field.type.unit)
            if pc.any(lost).as_py():
                problems[field.name] = (field.type, lost)
                unfit = pc.or_(unfit, lost)
        table = table.set_column(index, pa.field(field.name, kind), exact)
    if not problems:
        return table, []
    bad = _bad_rows(table, read, problems)
    return table.filter(pc.invert(unfit)), bad


def _fit(kind: pa.DataType) -> pa.DataType | None:
    """The type a column of `kind` loads as (None: as it is)."""
    if pa.types.is_uint64(kind):
        return pa.decimal128(20, 0)
    if pa.types.is_decimal(kind) and kind.precision > MAX_DECIMAL_DIGITS:
        return pa.string()  # every digit, as text
    if pa.types.is_decimal256(kind):
        return pa.decimal128(kind.precision, kind.scale)
    if pa.types.is_large_string(kind):
        return pa.string()
    if pa.types.is_large_binary(kind):
        return pa.binary()
    if pa.types.is_float16(kind):
        return pa.float64()
    if pa.types.is_timestamp(kind) and (kind.unit != "us" or kind.tz not in (None, "UTC")):
        return pa.timestamp("us", tz=None if kind.tz is None else "UTC")
    if pa.types.is_time(kind) and kind != pa.time64("us"):
        return pa.time64("us")
    if pa.types.is_duration(kind):
        return pa.int64()  # its microseconds: no target loads a duration
    return None


def _counts_time(kind: pa.DataType) -> bool:
    return pa.types.is_timestamp(kind) or pa.types.is_time(kind) or pa.types.is_duration(kind)


def _not_in_microseconds(column: pa.ChunkedArray, unit: str) -> pa.ChunkedArray:
    """True where a count of `unit` is no whole count of microseconds a signed 64-bit integer holds: nanoseconds
    cut, or seconds and milliseconds past it (their cast wraps silently)."""
    counts = pc.cast(column, pa.int64() if column.type.bit_width == 64 else pa.int32())  # time32 counts in 32 bits
    if unit == "ns":
        lost = pc.not_equal(pc.multiply(pc.divide(counts, 1000), 1000), counts)
    else:
        limit = (2**63 - 1) // _PER_UNIT[unit]
        lost = pc.or_(pc.greater(counts, limit), pc.less(counts, -limit))
    return pc.fill_null(lost, False)


def _exact_cast(column: pa.ChunkedArray, kind: pa.DataType, target: pa.DataType) -> pa.ChunkedArray:
    if pa.types.is_duration(kind):  # in microseconds, then as their count
        return pc.cast(pc.cast(column, pa.duration("us"), safe=False), pa.int64())
    return pc.cast(column, target, safe=False)


def as_json(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A struct, list or map column as JSON text, every value exact: times and decimals as their text (with all
    their digits), integers as numbers, bytes as hex, maps as objects."""
    texts = _textual(column.type)
    values = pc.cast(column, texts) if texts != column.type else column
    return pa.chunked_array(
        [pa.array([None if v is None else json.dumps(_plain(v, texts)) for v in values.to_pylist()], pa.string())]
    )


def _textual(kind: pa.DataType) -> pa.DataType:
    """`kind` with every time, decimal and dictionary inside it as text (Arrow casts nested types field by field)."""
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, _textual(f.type)) for f in kind])
    if pa.types.is_map(kind):
        return pa.map_(_textual(kind.key_type), _textual(kind.item_type))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return pa.list_(_textual(kind.value_type))
    if pa.types.is_dictionary(kind):
        return _textual(kind.value_type)
    if pa.types.is_temporal(kind) or pa.types.is_decimal(kind) or pa.types.is_large_string(kind):
        return pa.string()
    if pa.types.is_float16(kind):
        return pa.float64()
    return kind


def _plain(value: Any, kind: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_map(kind):
        return {str(k): _plain(v, kind.item_type) for k, v in value}
    if pa.types.is_struct(kind):
        return {f.name: _plain(value.get(f.name), f.type) for f in kind}
    if pa.types.is_list(kind):
        return [_plain(v, kind.value_type) for v in value]
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    return value


def _bad_rows(table: pa.Table, read: pa.Table, problems: dict[str, tuple[pa.DataType, pa.Array]]) -> list[BadRow]:
    """The rows as loaded would be, but their too-fine values as read, as text with every digit."""
    rows = table.column(ROW).to_pylist()
    for name in problems:
        index = table.schema.get_field_index(name)
        table = table.set_column(index, name, pc.cast(read.column(name), pa.string()))
    by_row: dict[int, list[str]] = {}
    for name, (kind, lost) in problems.items():
        for index in pc.indices_nonzero(lost).to_pylist():
            by_row.setdefault(index, []).append(
                f"column {name!r} ({kind}) is {_value(table, name, index)}: the target counts microseconds "
                "and cannot hold it exactly"
            )
    records = table.drop_columns([ROW]).take(pa.array(sorted(by_row))).to_pylist()
    return [
        BadRow(rows[index], None, "; ".join(by_row[index]), json.dumps(record, default=_text))
        for index, record in zip(sorted(by_row), records, strict=True)
    ]


def _value(table: pa.Table, name: str, index: int) -> str:
    return str(table.column(name)[index].as_py())


def _text(value: Any) -> str:
    return str(value)
