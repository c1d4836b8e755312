"""Apply accepted schema changes to an existing target table: widen a column, or keep the old values of
an incompatible one in a history column before changing its type. dlt itself never alters a type."""

from __future__ import annotations

from typing import Any

from ingestion_assets.schema.changes import SchemaChange
from ingestion_assets.sources.postgres.introspect import Column
from ingestion_assets.sources.postgres.landing import sql_type_of_arrow


def sql_type(destination_type: str, column: Column) -> str:
    """The column's SQL type in the destination: its native type, or the one of its Arrow type."""
    native = column.duckdb_type if destination_type == "duckdb" else column.postgres_type
    return native or sql_type_of_arrow(column.arrow_type, destination_type, column.is_json)


def migration_statements(
    destination_type: str, table: str, change: SchemaChange, new_type: str, quote: Any, staging: bool = False
) -> list[str]:
    """SQL for one widened or incompatible change; `quote` escapes a column name for the destination.

    dlt's staging table holds only the slice in flight: it just takes the new type, no history."""
    column = quote(change.column)
    convert = _convert(destination_type, column, change, new_type)
    if staging and change.kind != "widened":
        return [f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {new_type} USING {convert}"]
    if change.kind == "widened":
        using = f" USING {column}::{new_type}" if destination_type == "postgres" else ""
        return [f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {new_type}{using}"]
    assert change.old is not None
    history = quote(f"{change.column}__{change.old.type_name}")
    return [
        f"ALTER TABLE {table} ADD COLUMN {history} {_history_type(destination_type)}",
        f"UPDATE {table} SET {history} = CAST({column} AS {_history_type(destination_type)})",
        f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {new_type} USING {convert}",
    ]


_NUMBERS = {"int2", "int4", "int8", "float4", "float8"}
_NEVER_FAILS = {"double precision", "numeric", "text"}  # what every value of _NUMBERS converts to


def _convert(destination_type: str, column: str, change: SchemaChange, new_type: str) -> str:
    """How an incompatible change converts the values already in the target (the old ones are kept as text beside
    them): DuckDB tries each value; PostgreSQL has no TRY_CAST, so a cast no value can fail (integers to double
    precision, a timestamp read as UTC) converts and any other change leaves NULL."""
    if destination_type == "duckdb":
        return f"TRY_CAST({column} AS {new_type})"
    old = change.old.kind if change.old is not None else ""
    if old in _NUMBERS and new_type.lower() in _NEVER_FAILS:
        return f"{column}::{new_type}"
    if old == "timestamp" and new_type.lower() in ("timestamptz", "timestamp with time zone"):
        return f"{column} AT TIME ZONE 'UTC'"
    return "NULL"


def _history_type(destination_type: str) -> str:
    return "VARCHAR" if destination_type == "duckdb" else "TEXT"
