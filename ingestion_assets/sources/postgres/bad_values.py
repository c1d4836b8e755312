"""Values Arrow or the destination cannot hold, found row by row without slowing the rows that fit.

In SQL, only what would break parsing: each temporal or decimal column is read as
`CASE WHEN <fits> THEN col END`, and a row with such a value also carries itself as JSON (`_ingest_raw`).
In Arrow, vectorised, what parses but must not load (values over the size limit). `mark_problems` then
names every bad value of a row in `_ingest_problems` (column, value, why) for the dead-letter table.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from psycopg2 import sql

from ingestion_assets.sources.postgres.introspect import Column

PROBLEMS = "_ingest_problems"
RAW = "_ingest_raw"
_LOWEST = {
    "timestamptz": "timestamptz '0001-01-01 00:00:00+00'",
    "timestamp": "timestamp '0001-01-01'",
    "date": "date '0001-01-01'",
}
_INFINITY = {"timestamptz": "timestamptz 'infinity'", "timestamp": "timestamp 'infinity'", "date": "date 'infinity'"}


def fits(column: Column, server_version: int) -> sql.Composable | None:
    """The condition a non-NULL value must meet to parse into Arrow, or None when every value does.

    Cheap comparisons only: the special values sort at the ends (NaN above +Infinity for numeric)."""
    ident = sql.SQL("t.") + sql.Identifier(column.name)
    if column.type_name in _LOWEST:  # no infinity, no BC dates in Arrow
        return sql.SQL("({c} >= {low} AND {c} < {high})").format(
            c=ident, low=sql.SQL(_LOWEST[column.type_name]), high=sql.SQL(_INFINITY[column.type_name])
        )
    if column.type_name == "numeric" and pa.types.is_decimal(column.arrow_type):
        if server_version < 140000:
            return sql.SQL("({c} < 'NaN'::numeric)").format(c=ident)
        return sql.SQL("({c} < 'Infinity'::numeric AND {c} > '-Infinity'::numeric)").format(c=ident)
    return None


def raw_when_unfit(checks: Sequence[tuple[Column, sql.Composable]]) -> sql.Composable:
    """The row as JSON when one of its values does not fit, else NULL (evaluated once per checked value)."""
    if not checks:
        return sql.SQL("NULL::text")
    unfit = [
        sql.SQL("NOT ({c} IS NULL OR {ok})").format(c=sql.SQL("t.") + sql.Identifier(c.name), ok=ok) for c, ok in checks
    ]
    return sql.SQL("CASE WHEN {} THEN row_to_json(t.*)::text END").format(sql.SQL(" OR ").join(unfit))


def mark_problems(table: pa.Table, checked: Sequence[str], max_value_bytes: int) -> pa.Table:
    """Add `_ingest_problems`; values over the size limit are nulled and their rows get `_ingest_raw` too."""
    raw = table.column(RAW)
    oversized = _oversized(table, max_value_bytes)
    flagged = pc.is_valid(raw)
    for mask in oversized.values():
        flagged = pc.or_(flagged, mask)
    if not pc.any(flagged).as_py():
        return table.append_column(PROBLEMS, pa.nulls(table.num_rows, pa.string()))
    bad_rows = pc.indices_nonzero(flagged).to_pylist()
    problems: list[str | None] = [None] * table.num_rows
    raws = raw.to_pylist()
    for index in bad_rows:
        row = table.slice(index, 1).drop_columns([RAW]).to_pylist()[0]
        record = json.loads(raws[index]) if raws[index] else json.loads(json.dumps(row, default=_text))
        found = [
            f"{name}: {record.get(name)} does not fit the target type"
            for name in checked
            if row.get(name) is None and record.get(name) is not None
        ]
        found += [
            f"{name}: value of {len(str(row[name])):,} characters is over the size limit of {max_value_bytes:,} bytes"
            for name, mask in oversized.items()
            if mask[index].as_py()
        ]
        problems[index], raws[index] = "; ".join(found), raws[index] or json.dumps(record)
    columns = {
        name: pc.if_else(mask, pa.nulls(table.num_rows, table.column(name).type), table.column(name))
        for name, mask in oversized.items()
    }
    for name, values in columns.items():
        table = table.set_column(table.schema.get_field_index(name), name, values)
    table = table.set_column(table.schema.get_field_index(RAW), RAW, pa.array(raws, pa.string()))
    return table.append_column(PROBLEMS, pa.array(problems, pa.string()))


def _oversized(table: pa.Table, max_value_bytes: int) -> dict[str, pa.ChunkedArray]:
    found = {}
    for field in table.schema:
        if field.name != RAW and (pa.types.is_string(field.type) or pa.types.is_binary(field.type)):
            lengths = pc.binary_length(table.column(field.name))
            mask = pc.fill_null(pc.greater(lengths, max_value_bytes), False)
            if pc.any(mask).as_py():
                found[field.name] = mask
    return found


def _text(value: object) -> str:
    return value.hex() if isinstance(value, bytes) else str(value)
