"""The destination's own types where dlt has none (REAL, UUID, INTERVAL, LIST; PostgreSQL's interval, arrays,
ranges ...).

dlt names a column type with its own small set (double, text, json ...). A column hint carries the native
type (see sources/postgres/landing.py), and these type mappers use it wherever dlt writes a column type:
CREATE TABLE and ADD COLUMN, for the target and for the staging table a merge goes through. They subclass
dlt's, so this module imports dlt: only `make_destination` does, for a dlt load.
"""

from __future__ import annotations

from typing import Any

from dlt.destinations.impl.duckdb.factory import DuckDbTypeMapper
from dlt.destinations.impl.postgres.factory import PostgresTypeMapper

from ingestion_assets.sources.postgres.landing import DUCKDB_TYPE, POSTGRES_TYPE


class DuckDbNativeTypes(DuckDbTypeMapper):
    def to_destination_type(self, column: Any, table: Any) -> str:
        native = column.get(DUCKDB_TYPE)
        return str(native) if native else str(super().to_destination_type(column, table))


class PostgresNativeTypes(PostgresTypeMapper):
    def to_destination_type(self, column: Any, table: Any) -> str:
        native = column.get(POSTGRES_TYPE)
        return str(native) if native else str(super().to_destination_type(column, table))
