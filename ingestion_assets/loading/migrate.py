"""Apply accepted schema changes to an existing target table: widen a column, or keep the old values of
an incompatible one in a history column before changing its type, after counting the values its conversion
would not keep. dlt itself never alters a type."""

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
    precision, a timestamp read as UTC) converts and any other change leaves NULL, which `lost_values` counts
    before the change."""
    if destination_type == "duckdb":
        return f"TRY_CAST({column} AS {new_type})"
    old = change.old.kind if change.old is not None else ""
    if old in _NUMBERS and new_type.lower() in _NEVER_FAILS:
        return f"{column}::{new_type}"
    if old == "timestamp" and new_type.lower() in ("timestamptz", "timestamp with time zone"):
        return f"{column} AT TIME ZONE 'UTC'"
    return "NULL"


class ValuesWouldBeLost(RuntimeError):
    """An incompatible change whose conversion would not keep every value the target holds (NULL, or another
    value: 1.5 in a bigint is 2), for a stream that does not read those rows again: nothing was changed."""

    transient = False

    def __init__(self, table: str, change: SchemaChange, new_type: str, count: int, sample: str) -> None:
        self.change, self.count, self.sample = change, count, sample
        old = change.old.sql_type if change.old is not None else "-"
        what = f"{count} of the values it holds (e.g. {sample!r})" if count > 0 else f"every value it holds ({sample})"
        super().__init__(
            f"target {table}: changing column {change.column!r} from {old} to {new_type} may not keep {what}; "
            "nothing was changed"
        )


_HELD_TYPE = {
    "duckdb": "SELECT data_type FROM information_schema.columns "
    "WHERE table_schema = %s AND table_name = %s AND column_name = %s",
    "postgres": "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
    "WHERE a.attrelid = to_regclass(%s) AND a.attname = %s AND a.attnum > 0 AND NOT a.attisdropped",
}
_SAMPLE_CHARS = 60


def lost_values(client: Any, destination_type: str, table: str, change: SchemaChange, new_type: str) -> tuple[int, str]:
    """How many values of the changed column of `table` (the target's unqualified name) the change's conversion
    would not keep, and one of them: a value is kept when its converted value, cast back to the type the column
    has now, reads the same (5 as 5.0 in a double, not '0150' as 150 nor 1.5 as 2). A widened change keeps every
    value; so does a destination whose tables are not read back here (it refuses type changes)."""
    if change.kind == "widened" or change.old is None or destination_type not in _HELD_TYPE:
        return 0, ""
    qualified = client.make_qualified_table_name(table)
    where = (client.dataset_name, table) if destination_type == "duckdb" else (qualified,)
    held = client.execute_sql(_HELD_TYPE[destination_type], *where, change.column)
    if not held:
        return 0, ""
    column = client.escape_column_name(change.column)
    text = _history_type(destination_type)
    back = f"CAST(CAST({_convert(destination_type, column, change, new_type)} AS {held[0][0]}) AS {text})"
    rows = client.execute_sql(
        f"SELECT count(*), min(CAST({column} AS {text})) FROM {qualified} "
        f"WHERE {column} IS NOT NULL AND {back} IS DISTINCT FROM CAST({column} AS {text})"
    )
    count, sample = rows[0] if rows else (0, "")
    sample = str(sample or "")
    return int(count), sample if len(sample) <= _SAMPLE_CHARS else sample[:_SAMPLE_CHARS] + "..."


def _history_type(destination_type: str) -> str:
    return "VARCHAR" if destination_type == "duckdb" else "TEXT"
