"""A target table keeps the column types it was created with: an upgrade never changes the form of values
already loaded.

Versions before native types landed uuid, interval, arrays and domains as PostgreSQL's text. A target table
created then keeps text for those columns, in exactly the form its rows already hold (a refresh, which builds
a new table, lands them natively). dlt merges through a staging table it created from its own schema; a
staging column that differs from the target's is altered to the target's type while it is empty.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pyarrow as pa

from ingestion_assets.loading.naming_rules import normalize
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.sources.postgres.introspect import Column, TableShape, type_hints
from ingestion_assets.sources.postgres.query import ReadPlan

_TEXT = {"duckdb": ("VARCHAR",), "postgres": ("text", "character varying")}  # what text columns are named
_COLUMNS = {
    "duckdb": "SELECT column_name, data_type FROM information_schema.columns "
    "WHERE table_schema = %s AND table_name = %s",
    "postgres": "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
    "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped",
}


def fit_plan(plan: ReadPlan, loader: Loader) -> ReadPlan:
    return replace(plan, shape=fit_shape(plan.shape, loader))


def fit_shape(shape: TableShape, loader: Loader) -> TableShape:
    """The shape as the target holds it; the loader's column hints follow."""
    kind = loader.destination.type
    if kind not in _COLUMNS:  # no table there predates native types: the shape lands as it is
        loader.target = replace(loader.target, type_hints=type_hints(shape))
        return shape
    with loader.client() as client:
        target = _column_types(client, kind, loader.target.table)
        # as dlt names columns by default (snake_case, no length limit), which the pipelines use
        names = {c.name: normalize("snake_case", c.name, None) for c in shape.columns}
        columns = tuple(c.as_text() if _kept_as_text(c, target.get(names[c.name]), kind) else c for c in shape.columns)
        fitted = TableShape(shape.schema, shape.table, columns)
        if target:
            _align_staging(client, kind, loader.target.table, fitted, target)
    loader.target = replace(loader.target, type_hints=type_hints(fitted))
    return fitted


def target_column_types(loader: Loader) -> dict[str, str] | None:
    """Column -> SQL type of the stream's target table as it is now ({} when it does not exist); None for a
    destination whose tables are not read back here."""
    kind = loader.destination.type
    if kind not in _COLUMNS:
        return None
    with loader.client() as client:
        return _column_types(client, kind, loader.target.table)


def held_values(loader: Loader, columns: list[str]) -> dict[str, int] | None:
    """How many values other than NULL the target table holds in each of `columns` (source names) it has; a
    column it does not have is left out. None where this destination's columns are not read here."""
    held = target_column_types(loader)
    present = set(held) if held is not None else loader.held_columns()
    if present is None:
        return None
    names = {name: loader.names.column(name) for name in columns}
    names = {name: target for name, target in names.items() if target in present}
    if not names:
        return {}
    with loader.client() as client:
        counts = ", ".join(f"count({client.escape_column_name(target)})" for target in names.values())
        rows = client.execute_sql(f"SELECT {counts} FROM {client.make_qualified_table_name(loader.target.table)}")
    return {name: int(count or 0) for name, count in zip(names, rows[0], strict=True)}


_SAME = {  # PostgreSQL's format_type() names of what the landing names otherwise
    "timestamptz": "timestamp with time zone",
    "timestamp": "timestamp without time zone",
    "time": "time without time zone",
    "varchar": "character varying",
    "double": "double precision",
    "float8": "double precision",
    "float4": "real",
    "int": "integer",
    "int4": "integer",
    "int8": "bigint",
    "int2": "smallint",
    "bool": "boolean",
    "decimal": "numeric",
}


def same_sql_type(held: str, wanted: str) -> bool:
    """Whether a column the target holds as `held` (its catalog's spelling) already has the type `wanted`."""
    return _spelled(held) == _spelled(wanted)


def _spelled(sql_type: str) -> str:
    name, paren, rest = sql_type.strip().lower().partition("(")
    name = _SAME.get(name.strip(), name.strip())
    return f"{name}{paren}{rest.replace(' ', '')}"


def _kept_as_text(column: Column, existing: str | None, kind: str) -> bool:
    native = column.duckdb_type if kind == "duckdb" else column.postgres_type
    lands_natively = native is not None or column.arrow_type != pa.string()
    textual = existing is not None and existing.split("(")[0] in _TEXT[kind]  # VARCHAR, not VARCHAR[]
    return textual and lands_natively and not column.is_json


def _align_staging(client: Any, kind: str, table: str, shape: TableShape, target: dict[str, str]) -> None:
    with client.with_staging_dataset() as staging:
        current = _column_types(staging, kind, table)
        names = [normalize("snake_case", c.name, None) for c in shape.columns]
        differ = [name for name in names if name in current and current[name] != target.get(name)]
        if not differ:
            return
        qualified = staging.make_qualified_table_name(table)
        with staging.begin_transaction():
            staging.execute_sql(f"DELETE FROM {qualified}")  # a slice in flight only; the next load refills it
            for name in differ:
                column = staging.escape_column_name(name)
                using = f" USING {column}::{target[name]}" if kind == "postgres" else ""
                staging.execute_sql(f"ALTER TABLE {qualified} ALTER COLUMN {column} TYPE {target[name]}{using}")


def _column_types(client: Any, kind: str, table: str) -> dict[str, str]:
    """Column name -> SQL type of the table as it exists now (empty when it does not)."""
    if kind == "duckdb":
        rows = client.execute_sql(_COLUMNS[kind], client.dataset_name, table)
    else:
        rows = client.execute_sql(_COLUMNS[kind], client.make_qualified_table_name(table))
    return {str(name): str(sql_type) for name, sql_type in rows or ()}
