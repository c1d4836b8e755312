"""Read a table's columns from the PostgreSQL catalog and map each to the Arrow type that keeps its meaning."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from psycopg2.extensions import connection as PgConnection

MAX_DECIMAL_PRECISION = 38  # what Arrow decimal128, DuckDB and most warehouses hold exactly

_FIXED_TYPES: dict[str, pa.DataType] = {
    "int2": pa.int16(),
    "int4": pa.int32(),
    "int8": pa.int64(),
    "oid": pa.int64(),
    "float4": pa.float32(),
    "float8": pa.float64(),
    "bool": pa.bool_(),
    "date": pa.date32(),
    "time": pa.time64("us"),
    "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", tz="UTC"),
    "bytea": pa.binary(),
}
JSON_TYPES = frozenset({"json", "jsonb"})

# The lowest value of a type: a NULL cursor sorts and compares as this, so NULL rows are neither skipped
# nor stuck (a row comparison with NULL is never true).
_LOWEST: dict[str, str] = {
    "timestamptz": "-infinity",
    "timestamp": "-infinity",
    "date": "-infinity",
    "int2": "-32768",
    "int4": "-2147483648",
    "int8": "-9223372036854775808",
    "numeric": "-Infinity",
    "float4": "-Infinity",
    "float8": "-Infinity",
}


class TableNotReadable(LookupError):
    """The table or a named column is missing; the message names the stream and what to fix."""

    transient = False


@dataclass(frozen=True)
class Column:
    name: str
    type_name: str  # pg_type.typname, e.g. int8, timestamptz, _text for arrays
    sql_type: str  # format_type(): what a literal is cast to, e.g. numeric(38,9)
    nullable: bool
    arrow_type: pa.DataType

    @property
    def is_json(self) -> bool:
        return self.type_name in JSON_TYPES

    def dlt_hint(self) -> dict[str, object] | None:
        """What dlt cannot infer from the Arrow type: JSON stays JSON, a local timestamp stays local."""
        if self.is_json:
            return {"data_type": "json"}
        if self.type_name == "timestamp":
            return {"data_type": "timestamp", "timezone": False, "precision": 6}
        return None

    @property
    def lowest_literal(self) -> str:
        """The value a NULL of this column orders as (text types: the empty string)."""
        return _LOWEST.get(self.type_name, "")


@dataclass(frozen=True)
class TableShape:
    schema: str
    table: str
    columns: tuple[Column, ...]

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(name)

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.arrow_type, nullable=c.nullable) for c in self.columns])


def arrow_type_for(type_name: str, sql_type: str, precision: int | None, scale: int | None) -> pa.DataType:
    """Exact where Arrow can be exact; everything else travels as text, never as a lossy float."""
    if type_name in _FIXED_TYPES:
        return _FIXED_TYPES[type_name]
    if type_name == "numeric" and precision is not None and precision <= MAX_DECIMAL_PRECISION:
        return pa.decimal128(precision, scale or 0)
    return pa.string()  # text, varchar, uuid, json, unconstrained numeric, arrays, intervals, enums ...


_COLUMNS_SQL = """
SELECT a.attname,
       t.typname,
       format_type(a.atttypid, a.atttypmod),
       NOT a.attnotnull,
       CASE WHEN t.typname = 'numeric' AND a.atttypmod > 0 THEN ((a.atttypmod - 4) >> 16) & 65535 END,
       CASE WHEN t.typname = 'numeric' AND a.atttypmod > 0 THEN (a.atttypmod - 4) & 65535 END
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_type t ON t.oid = a.atttypid
WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""


def discover_table(conn: PgConnection, schema: str, table: str) -> TableShape:
    with conn.cursor() as cur:
        cur.execute(_COLUMNS_SQL, (schema, table))
        rows = cur.fetchall()
    if not rows:
        raise TableNotReadable(f"table {schema}.{table} does not exist or has no columns visible to this user")
    columns = tuple(
        Column(
            name=name,
            type_name=type_name,
            sql_type=sql_type,
            nullable=nullable,
            arrow_type=arrow_type_for(type_name, sql_type, precision, scale),
        )
        for name, type_name, sql_type, nullable, precision, scale in rows
    )
    return TableShape(schema=schema, table=table, columns=columns)
