"""Apply accepted schema changes to an existing target table: widen a column, or keep the old values of
an incompatible one in a history column before changing its type. dlt itself never alters a type."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ingestion_assets.schema.changes import SchemaChange

_DUCKDB = {
    "int16": "SMALLINT",
    "int32": "INTEGER",
    "int64": "BIGINT",
    "float": "REAL",
    "double": "DOUBLE",
    "string": "VARCHAR",
    "bool": "BOOLEAN",
    "date32[day]": "DATE",
    "time64[us]": "TIME",
    "timestamp[us]": "TIMESTAMP",
    "timestamp[us, tz=UTC]": "TIMESTAMP WITH TIME ZONE",
    "binary": "BLOB",
}
_POSTGRES = {
    "int16": "SMALLINT",
    "int32": "INTEGER",
    "int64": "BIGINT",
    "float": "REAL",
    "double": "DOUBLE PRECISION",
    "string": "VARCHAR",
    "bool": "BOOLEAN",
    "date32[day]": "DATE",
    "time64[us]": "TIME",
    "timestamp[us]": "TIMESTAMP",
    "timestamp[us, tz=UTC]": "TIMESTAMPTZ",
    "binary": "BYTEA",
}


def sql_type(destination_type: str, arrow_type: pa.DataType, is_json: bool) -> str:
    if is_json:
        return "JSON" if destination_type == "duckdb" else "JSONB"
    if pa.types.is_decimal(arrow_type):
        name = "DECIMAL" if destination_type == "duckdb" else "NUMERIC"
        return f"{name}({arrow_type.precision},{arrow_type.scale})"
    names = _DUCKDB if destination_type == "duckdb" else _POSTGRES
    return names[str(arrow_type)]


def migration_statements(
    destination_type: str, table: str, change: SchemaChange, new_type: str, quote: Any, staging: bool = False
) -> list[str]:
    """SQL for one widened or incompatible change; `quote` escapes a column name for the destination.

    dlt's staging table holds only the slice in flight: it just takes the new type, no history."""
    column = quote(change.column)
    if staging and change.kind != "widened":
        convert = f"TRY_CAST({column} AS {new_type})" if destination_type == "duckdb" else "NULL"
        return [f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {new_type} USING {convert}"]
    if change.kind == "widened":
        using = f" USING {column}::{new_type}" if destination_type == "postgres" else ""
        return [f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {new_type}{using}"]
    assert change.old is not None
    history = quote(f"{change.column}__{change.old.type_name}")
    convert = f"TRY_CAST({column} AS {new_type})" if destination_type == "duckdb" else "NULL"
    return [
        f"ALTER TABLE {table} ADD COLUMN {history} {_history_type(destination_type)}",
        f"UPDATE {table} SET {history} = CAST({column} AS {_history_type(destination_type)})",
        f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {new_type} USING {convert}",
    ]


def _history_type(destination_type: str) -> str:
    return "VARCHAR" if destination_type == "duckdb" else "TEXT"
