"""Values Arrow's CSV reader cannot parse, and values the destination cannot hold, found row by row without
slowing the rows that parse.

In SQL, only what would break parsing: each temporal or decimal column is read as
`CASE WHEN <parses> THEN col END`, and a row with such a value also carries itself as JSON (`_ingest_raw`).
The rare temporal values among them (±infinity, BC, years past 9999, 24:00) are then parsed from that JSON
and put back; intervals and arrays are decoded from their text. What still does not fit (NaN in a decimal,
a timestamp past the load's range, a multi-dimensional array in a LIST column, a value over the size limit)
is named in `_ingest_problems` (column, value, why) for the dead-letter table.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from psycopg2 import sql

from ingestion_assets.sources.postgres import temporal, values
from ingestion_assets.sources.postgres.introspect import Column, TableShape

PROBLEMS = "_ingest_problems"
# NaN in a numeric(p,s): the load carries it as an Arrow decimal, which has no NaN (a PostgreSQL target's numeric
# would hold it; the load cannot bring it there)
NO_DECIMAL_VALUE = (
    "has no exact decimal value: the load carries numeric(p,s) as Arrow decimals, whatever the destination"
)
RAW = "_ingest_raw"
_PARSED_FROM = {  # Arrow's CSV reader parses four-digit years AD only, and no infinity
    "timestamptz": ("timestamptz '0001-01-01 00:00:00+00'", "timestamptz '10000-01-01 00:00:00+00'"),
    "timestamp": ("timestamp '0001-01-01'", "timestamp '10000-01-01'"),
    "date": ("date '0001-01-01'", "date '10000-01-01'"),
}


def fits(column: Column) -> sql.Composable | None:
    """The condition a non-NULL value must meet to parse in Arrow's CSV reader, or None when every value does.

    Cheap comparisons only: the special values sort at the ends. A decimal column is a numeric(p,s), which holds
    NaN (sorted above every number) but no ±Infinity (only an unconstrained numeric does, from PostgreSQL 14 on):
    one comparison per value."""
    ident = sql.SQL("t.") + sql.Identifier(column.name)
    if column.kind in _PARSED_FROM:
        low, high = _PARSED_FROM[column.kind]
        return sql.SQL("({c} >= {low} AND {c} < {high})").format(c=ident, low=sql.SQL(low), high=sql.SQL(high))
    if column.kind == "time":
        return sql.SQL("({c} < '24:00:00'::time)").format(c=ident)
    if column.kind == "numeric" and pa.types.is_decimal(column.arrow_type):
        return sql.SQL("({c} < 'NaN'::numeric)").format(c=ident)
    return None


def raw_when_unfit(checks: Sequence[tuple[Column, sql.Composable]]) -> sql.Composable:
    """The row as JSON when one of its values does not fit, else NULL (evaluated once per checked value)."""
    if not checks:
        return sql.SQL("NULL::text")
    unfit = [
        sql.SQL("NOT ({c} IS NULL OR {ok})").format(c=sql.SQL("t.") + sql.Identifier(c.name), ok=ok) for c, ok in checks
    ]
    return sql.SQL("CASE WHEN {} THEN row_to_json(t.*)::text END").format(sql.SQL(" OR ").join(unfit))


def mark_problems(table: pa.Table, shape: TableShape, checked: Sequence[str], max_value_bytes: int) -> pa.Table:
    """Decode, recover and size-check a slice; add `_ingest_problems` (NULL for a row that loads as it is) and
    keep `_ingest_raw` only for rows with a problem (a value nulled, so the raw record keeps what it was)."""
    found: dict[int, list[str]] = defaultdict(list)
    originals: dict[int, dict[str, Any]] = defaultdict(dict)  # row -> column -> text of a value nulled in Arrow
    table = null_oversized(table, max_value_bytes, found)
    table, unfitting = values.decode_texts(table, shape, _rare_values(table, shape, checked, found))
    for index, items in unfitting.items():
        found[index] += [str(item) for item in items]
        originals[index].update({item.column: item.text for item in items})
    raws = table.column(RAW)
    if not found:
        empty = pa.nulls(table.num_rows, pa.string())
        if raws.null_count < len(raws):  # every flagged value was recovered
            table = table.set_column(table.schema.get_field_index(RAW), RAW, empty)
        return table.append_column(PROBLEMS, empty)
    raw_texts: list[str | None] = [None] * table.num_rows
    problems: list[str | None] = [None] * table.num_rows
    for index, why in found.items():
        raw = raws[index].as_py()
        record = json.loads(raw) if raw else {**_record(table, index), **originals.get(index, {})}
        raw_texts[index], problems[index] = raw or json.dumps(record, default=_text), "; ".join(why)
    table = table.set_column(table.schema.get_field_index(RAW), RAW, pa.array(raw_texts, pa.string()))
    return table.append_column(PROBLEMS, pa.array(problems, pa.string()))


def null_oversized(table: pa.Table, max_value_bytes: int, found: dict[int, list[str]]) -> pa.Table:
    """Values over the limit nulled, each named in `found` (row -> problems). Text and JSON are measured in bytes
    of UTF-8, bytea in its bytes (decoded from its hex text first); before decoding, an array or interval is
    measured by its text, as COPY sent it. A CDC stream measures the log's values here too (streams/cdc/rows.py),
    so a value parks alike whether the copy or the log brings it."""
    for field in table.schema:
        if field.name == RAW or not (pa.types.is_string(field.type) or pa.types.is_binary(field.type)):
            continue
        column = table.column(field.name)
        sizes = pc.binary_length(column)
        mask = pc.fill_null(pc.greater(sizes, max_value_bytes), False)
        if not pc.any(mask).as_py():
            continue
        for index in pc.indices_nonzero(mask).to_pylist():
            size = sizes[index].as_py()  # bytes, as the limit counts them (a character of UTF-8 may take 4)
            found[index].append(
                f"{field.name}: value of {size:,} bytes is over the size limit of {max_value_bytes:,} bytes"
            )
        nulled = pc.if_else(mask, pa.nulls(table.num_rows, field.type), column)
        table = table.set_column(table.schema.get_field_index(field.name), field.name, nulled)
    return table


def _rare_values(
    table: pa.Table, shape: TableShape, checked: Sequence[str], found: dict[int, list[str]]
) -> dict[str, dict[int, str]]:
    """The texts of values the SQL left NULL because Arrow's CSV reader cannot parse them, from the row's JSON:
    temporal ones are parsed after (column -> row -> text); any other (NaN in a decimal) does not fit."""
    raws = table.column(RAW)
    rare: dict[str, dict[int, str]] = defaultdict(dict)
    if raws.null_count == len(raws):
        return rare
    for index in pc.indices_nonzero(pc.is_valid(raws)).to_pylist():
        record = json.loads(raws[index].as_py())
        for name in checked:
            value = record.get(name)
            if value is None or table.column(name)[index].is_valid:
                continue
            if shape.column(name).kind in temporal.TEMPORAL:
                rare[name][index] = str(value)
            else:
                found[index].append(f"{name}: {value} {NO_DECIMAL_VALUE}")
    return rare


def _record(table: pa.Table, index: int) -> dict[str, Any]:
    """One row as JSON-ready values (temporal values Python cannot hold as PostgreSQL's text)."""
    return {name: values.plain(table.column(name)[index]) for name in table.column_names if name != RAW}


def _text(value: object) -> str:
    return value.hex() if isinstance(value, bytes) else str(value)
