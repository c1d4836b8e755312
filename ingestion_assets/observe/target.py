"""What a stream's target table holds now: its row count and its columns, read from the destination.

The asset page shows the table, not the read: `rows read` says what a run copied, the row count here
what the table holds after it (merges, deletes and dead letters make the two differ)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import duckdb
import sqlalchemy as sa

from ingestion_assets.catalog import Destination
from ingestion_assets.loading.destinations import (
    connect_postgres,
    destination_url,
    duckdb_path,
    make_destination,
    target_names,
    writer_lock,
)
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
    if destination.type == "sqlalchemy":
        return _read_sqlalchemy(destination_url(settings, destination), schema, name)
    if destination.type == "filesystem":
        return _read_lake(settings, destination, schema, name)
    if destination.type == "dlt":  # passed through: its SQL is not ours to guess
        return TargetTableFacts(schema, name, None, ())
    if destination.type == "duckdb":
        path = duckdb_path(settings, destination)
        if not path.exists():
            return TargetTableFacts(schema, name, None, ())
        with writer_lock(settings, destination, dataset, table), contextlib.closing(duckdb.connect(str(path))) as con:
            columns = con.execute(_COLUMNS.replace("%s", "?"), [schema, name]).fetchall()
            rows = con.execute(f'SELECT count(*) FROM "{schema}"."{name}"').fetchone() if columns else None
    else:
        with contextlib.closing(connect_postgres(settings, destination)) as conn:
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


class TargetUnavailable(OSError):
    """The target could not be asked (the run's data is committed either way)."""


def _read_sqlalchemy(url: str, schema: str, name: str) -> TargetTableFacts:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            statement = sa.text(_COLUMNS.replace("%s", ":schema", 1).replace("%s", ":name"))
            found = conn.execute(statement, {"schema": schema, "name": name})
            columns = [tuple(row) for row in found]
            count = None
            if columns:
                quote = engine.dialect.identifier_preparer.quote
                count = conn.execute(sa.text(f"SELECT count(*) FROM {quote(schema)}.{quote(name)}")).scalar()
    except sa.exc.SQLAlchemyError as exc:
        raise TargetUnavailable(str(exc).splitlines()[0]) from exc
    finally:
        engine.dispose()
    return TargetTableFacts(
        schema,
        name,
        None if count is None else int(count),
        tuple(TargetColumn(str(c), str(t), str(n).upper() == "YES") for c, t, n in columns),
    )


def _read_lake(settings: Settings, destination: Destination, schema: str, name: str) -> TargetTableFacts:
    """The table's row count (from the Parquet footers of its current files) and its columns, read in the
    destination's table format (Delta, Iceberg or plain Parquet)."""
    import dlt  # a lake's metadata is read through dlt's filesystem client: imported for lakes only

    from ingestion_assets.loading.lake_tables import LakeTables

    pipeline = dlt.pipeline(
        pipeline_name=f"ingest_observe__{schema}",
        pipelines_dir=str(settings.dlt_dir),
        destination=make_destination(settings, destination),
        dataset_name=schema,
    )
    dataset = LakeTables.of(pipeline).stream_tables(pipeline, destination.table_format).dataset(name)
    if dataset is None:
        return TargetTableFacts(schema, name, None, ())
    columns = tuple(TargetColumn(f.name, str(f.type), f.nullable) for f in dataset.schema)
    return TargetTableFacts(schema, name, int(dataset.count_rows()), columns)
