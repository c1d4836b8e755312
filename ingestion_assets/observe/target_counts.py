"""How many rows each stream's target table holds now, and how many of its rows wait parked in the dead-letter
table, asked of the destination itself: what `ingest status` shows (a run's metadata says what the table held after
that run and what that run parked, not what the target holds now: parked rows stay until a run or a replay
releases them).

One connection per destination and one count per table, each bounded by a timeout."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import psycopg2
import sqlalchemy as sa

from ingestion_assets.catalog import Destination
from ingestion_assets.errors import ServerUnavailable
from ingestion_assets.loading.dead_letters import DEAD_LETTER_TABLE
from ingestion_assets.loading.destinations import (
    connect_postgres,
    describe_destination,
    destination_url,
    duckdb_path,
    target_names,
)
from ingestion_assets.loading.metadata_columns import DELETED_AT
from ingestion_assets.loading.sql_targets import is_mysql
from ingestion_assets.observe.target import read_target
from ingestion_assets.settings import Settings

COUNT_TIMEOUT_SECONDS = 10
Table = tuple[str, str]  # (dataset, table) as the catalog names them: the source and the stream
Counted = tuple[int, int] | None  # a table's rows, and how many of them are soft-deleted; None: no table


@dataclass(frozen=True)
class TargetCounts:
    """Rows per table (None: the table does not exist); `problem` says why nothing could be counted."""

    rows: dict[Table, int | None] = field(default_factory=dict)  # every row, soft-deleted ones too
    problem: str | None = None
    parked: dict[Table, int] = field(default_factory=dict)  # rows parked per stream now (lakes: not counted)
    soft_deleted: dict[Table, int] = field(default_factory=dict)  # rows with `_ingest_deleted_at` set (not lakes)

    def live(self, table: Table) -> int | None:
        """The rows a reader of live data sees: soft-deleted ones left out."""
        rows = self.rows.get(table)
        return None if rows is None else rows - self.soft_deleted.get(table, 0)

    def counted(self, table: Table) -> bool:
        return self.problem is None and table in self.rows


def count_target_rows(
    settings: Settings, destination: Destination, tables: Sequence[Table], timeout: float = COUNT_TIMEOUT_SECONDS
) -> TargetCounts:
    """Each table's row count now; an unreachable, busy or slow destination as `problem`, in one line."""
    where = describe_destination(settings, destination)
    if destination.type == "dlt":  # passed through: its SQL is not ours to guess
        return TargetCounts(problem=f"rows in target not counted ({where}): a dlt destination is not queried")
    names = target_names(destination)
    named = {(names.column(dataset), names.column(table)): (dataset, table) for dataset, table in tables}
    try:
        if destination.type == "filesystem":  # a lake: the row counts of its Parquet footers
            return _count_lake(settings, destination, tables, where)
        found, parked = _count(settings, destination, list(named), timeout, names.column(DELETED_AT))
    except (duckdb.Error, psycopg2.Error, sa.exc.SQLAlchemyError, ServerUnavailable, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        named_already = isinstance(exc, ServerUnavailable)  # its message names the destination and what to fix
        return TargetCounts(problem=f"rows in target not counted{'' if named_already else f' ({where})'}: {first}")
    counted = {named[table]: rows[0] if rows is not None else None for table, rows in found.items()}
    deleted = {named[table]: rows[1] for table, rows in found.items() if rows is not None}
    parked_now = {(d, t): parked.get((names.column(d), t), 0) for d, t in tables}
    return TargetCounts(counted, parked=parked_now, soft_deleted=deleted)


def _count_lake(settings: Settings, destination: Destination, tables: Sequence[Table], where: str) -> TargetCounts:
    try:
        return TargetCounts({table: read_target(settings, destination, *table).rows for table in tables})
    except Exception as exc:  # noqa: BLE001 - a lake's reader raises its own (pyiceberg): said, never a crash
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return TargetCounts(problem=f"rows in target not counted ({where}): {first}")


def _count(
    settings: Settings, destination: Destination, tables: list[Table], timeout: float, deleted_at: str
) -> tuple[dict[Table, Counted], dict[Table, int]]:
    """The rows of each table (and its soft-deleted ones: `deleted_at` set), and the dead letters per (dataset,
    stream) of each dataset that has parked any."""
    parked_table = target_names(destination).column(DEAD_LETTER_TABLE)
    datasets = sorted({dataset for dataset, _ in tables})
    if destination.type == "duckdb":
        return _count_duckdb(settings, destination, tables, datasets, parked_table, deleted_at)
    if destination.type == "postgres":
        return _count_postgres(settings, destination, tables, datasets, parked_table, timeout, deleted_at)
    url = destination_url(settings, destination)
    return _count_sqlalchemy(url, tables, datasets, parked_table, timeout, deleted_at)


def _count_sql(table: str, deleted_at: str | None, quote: Callable[[str], str]) -> str:
    """All rows and the soft-deleted ones, in one scan (a table without the column has none)."""
    return f"SELECT count(*), {f'count({quote(deleted_at)})' if deleted_at else '0'} FROM {table}"


def _pair(row: Any) -> tuple[int, int]:
    return int(row[0]), int(row[1])


def _count_duckdb(
    settings: Settings,
    destination: Destination,
    tables: list[Table],
    datasets: list[str],
    parked_table: str,
    deleted_at: str,
) -> tuple[dict[Table, Counted], dict[Table, int]]:
    """Read-only, without the writer lock: a load in progress makes the count fail at once (said so), not wait."""
    path = duckdb_path(settings, destination)
    if not path.exists():
        return dict.fromkeys(tables), {}
    with contextlib.closing(duckdb.connect(str(path), read_only=True)) as con:
        listed = con.execute("SELECT table_schema, table_name FROM information_schema.tables").fetchall()
        present = {(schema, name) for schema, name in listed}
        marked = con.execute(
            "SELECT table_schema, table_name FROM information_schema.columns WHERE column_name = ?", [deleted_at]
        ).fetchall()
        flagged = {(schema, name) for schema, name in marked}
        rows: dict[Table, Counted] = {
            (s, t): _pair(
                con.execute(
                    _count_sql(f"{_quoted(s)}.{_quoted(t)}", deleted_at if (s, t) in flagged else None, _quoted)
                ).fetchone()
            )
            if (s, t) in present
            else None
            for s, t in tables
        }
        parked: dict[Table, int] = {}
        for dataset in (d for d in datasets if (d, parked_table) in present):
            parked.update(_per_stream(dataset, con.execute(_parked_sql(dataset, parked_table)).fetchall()))
        return rows, parked


def _count_postgres(
    settings: Settings,
    destination: Destination,
    tables: list[Table],
    datasets: list[str],
    parked_table: str,
    timeout: float,
    deleted_at: str,
) -> tuple[dict[Table, Counted], dict[Table, int]]:
    options = f"-c statement_timeout={int(timeout * 1000)}"
    counts: dict[Table, Counted] = {}
    parked: dict[Table, int] = {}
    conn = connect_postgres(settings, destination, connect_timeout=int(timeout), options=options)
    with contextlib.closing(conn):
        conn.autocommit = True
        with conn.cursor() as cur:
            for schema, name in tables:
                qualified = f"{_quoted(schema)}.{_quoted(name)}"
                cur.execute("SELECT to_regclass(%s)", (qualified,))
                if cur.fetchone()[0] is None:
                    counts[(schema, name)] = None
                    continue
                cur.execute(
                    "SELECT 1 FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                    "AND column_name = %s",
                    (schema, name, deleted_at),
                )
                flagged = cur.fetchone() is not None
                cur.execute(_count_sql(qualified, deleted_at if flagged else None, _quoted))
                counts[(schema, name)] = _pair(cur.fetchone())
            for dataset in datasets:
                cur.execute("SELECT to_regclass(%s)", (f"{_quoted(dataset)}.{_quoted(parked_table)}",))
                if cur.fetchone()[0] is not None:
                    cur.execute(_parked_sql(dataset, parked_table))
                    parked.update(_per_stream(dataset, cur.fetchall()))
    return counts, parked


def _count_sqlalchemy(
    url: str, tables: list[Table], datasets: list[str], parked_table: str, timeout: float, deleted_at: str
) -> tuple[dict[Table, Counted], dict[Table, int]]:
    connect_args = {"connect_timeout": int(timeout), "read_timeout": int(timeout)} if is_mysql(url) else {}
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool, connect_args=connect_args)
    try:
        with engine.connect() as conn:
            inspector = sa.inspect(conn)
            quote = engine.dialect.identifier_preparer.quote
            counts: dict[Table, Counted] = {}
            for schema, name in tables:
                if not inspector.has_table(name, schema=schema):
                    counts[(schema, name)] = None
                    continue
                flagged = deleted_at in {c["name"] for c in inspector.get_columns(name, schema=schema)}
                counted = _count_sql(f"{quote(schema)}.{quote(name)}", deleted_at if flagged else None, quote)
                counts[(schema, name)] = _pair(conn.execute(sa.text(counted)).one())
            parked: dict[Table, int] = {}
            for dataset in (d for d in datasets if inspector.has_table(parked_table, schema=d)):
                stream = quote("stream")
                grouped = f"SELECT {stream}, count(*) FROM {quote(dataset)}.{quote(parked_table)} GROUP BY {stream}"
                parked.update(_per_stream(dataset, conn.execute(sa.text(grouped)).all()))
            return counts, parked
    finally:
        engine.dispose()


def _parked_sql(dataset: str, parked_table: str) -> str:
    return f"SELECT stream, count(*) FROM {_quoted(dataset)}.{_quoted(parked_table)} GROUP BY stream"


def _per_stream(dataset: str, grouped: Sequence[Any]) -> dict[Table, int]:
    return {(dataset, str(stream)): int(count) for stream, count in grouped}


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
