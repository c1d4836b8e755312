"""Values Arrow or the destination cannot hold, found by the source query itself, row by row.

Each risky column is read as `CASE WHEN <fits> THEN col END`; a per-row `_ingest_problems` text names
every value that did not fit (column, value, why), and `_ingest_raw` carries such a row in full as JSON
for the dead-letter table. Rows without problems pay only the checks.
"""

from __future__ import annotations

import pyarrow as pa
from psycopg2 import sql

from ingestion_assets.sources.postgres.introspect import Column

PROBLEMS = "_ingest_problems"
RAW = "_ingest_raw"
_TEMPORAL = {
    "timestamptz": "timestamptz '0001-01-01 00:00:00+00'",
    "timestamp": "timestamp '0001-01-01'",
    "date": "date '0001-01-01'",
}
_SIZED = {"text", "varchar", "bpchar", "json", "jsonb", "bytea", "xml", "citext"}


def fits(column: Column, max_value_bytes: int, server_version: int) -> sql.Composable | None:
    """The condition a non-NULL value must meet to load, or None when every value of the type loads."""
    ident = sql.SQL("t.") + sql.Identifier(column.name)
    if column.type_name in _TEMPORAL:  # Arrow has no infinity and no BC dates
        return sql.SQL("(isfinite({c}) AND {c} >= {low})").format(c=ident, low=sql.SQL(_TEMPORAL[column.type_name]))
    if column.type_name == "numeric" and pa.types.is_decimal(column.arrow_type):
        special = "'NaN'" if server_version < 140000 else "'NaN', 'Infinity', '-Infinity'"
        return sql.SQL("({c} NOT IN ({special}))").format(c=ident, special=sql.SQL(special))
    if column.type_name in _SIZED:
        plain = column.type_name in ("text", "varchar", "bpchar", "bytea", "citext")
        text = ident if plain else sql.SQL("{}::text").format(ident)
        return sql.SQL("(octet_length({v}) <= {limit})").format(v=text, limit=sql.Literal(max_value_bytes))
    return None


def problem_text(column: Column, condition: sql.Composable) -> sql.Composable:
    ident = sql.SQL("t.") + sql.Identifier(column.name)
    label = sql.Literal(f"{column.name}: ")
    reason = sql.Literal(
        " does not fit the target type" if column.type_name not in _SIZED else " is over the size limit"
    )
    value = sql.SQL("left({c}::text, 200)").format(c=ident)
    return sql.SQL("CASE WHEN {c} IS NOT NULL AND NOT {ok} THEN {label} || {value} || {reason} END").format(
        c=ident, ok=condition, label=label, value=value, reason=reason
    )
