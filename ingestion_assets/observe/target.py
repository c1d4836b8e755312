"""What a stream's target table holds now: its row count and its columns, read from the destination.

The asset page shows the table, not the read: `rows read` says what a run copied, the row count here
what the table holds after it (merges, deletes and dead letters make the two differ)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import duckdb
import psycopg2

from ingestion_assets.catalog import Destination
from ingestion_assets.loading.destinations import destination_url, duckdb_path, target_names, writer_lock
from ingestion_assets.settings import Settings

_COLUMNS = (
    "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
    "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position"
)


@dataclass(frozen=True)
class TargetColumn:
    name: str
    type: str  # the destination's own spelling (DuckDB `DECIMAL(38,9)`, PostgreSQL `numeric`)
    nullable: bool


@dataclass(frozen=True)
class TargetTableFacts:
    """The target table: None rows means the table does not exist (yet)."""

    dataset: str
    table: str
    rows: int | None
    columns: tuple[TargetColumn, ...]

    @property
    def exists(self) -> bool:
        return self.rows is not None


def read_target(settings: Settings, destination: Destination, dataset: str, table: str) -> TargetTableFacts:
    """Count the rows and list the columns of `dataset.table`, under the target's writer lock (a DuckDB file
    admits no reader beside a writing process)."""
    names = target_names(destination)
    schema, name = names.column(dataset), names.column(table)
    if destination.type == "duckdb":
        path = duckdb_path(settings, destination)
        if not path.exists():
            return TargetTableFacts(schema, name, None, ())
        with writer_lock(settings, destination, dataset, table), contextlib.closing(duckdb.connect(str(path))) as con:
            columns = con.execute(_COLUMNS.replace("%s", "?"), [schema, name]).fetchall()
            rows = con.execute(f'SELECT count(*) FROM "{schema}"."{name}"').fetchone() if columns else None
    else:
        with contextlib.closing(psycopg2.connect(destination_url(settings, destination))) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(_COLUMNS, (schema, name))
                columns = cur.fetchall()
                rows = None
                if columns:
                    cur.execute(f'SELECT count(*) FROM "{schema}"."{name}"')
                    rows = cur.fetchone()
    return TargetTableFacts(
        schema,
        name,
        int(rows[0]) if rows is not None else None,
        tuple(TargetColumn(str(c), str(t), str(n).upper() == "YES") for c, t, n in columns),
    )
