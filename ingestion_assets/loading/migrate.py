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
