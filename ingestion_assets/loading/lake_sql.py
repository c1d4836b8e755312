"""A read-only SQL view of a lake's tables: an in-memory DuckDB over the table format's Arrow datasets.

Reconciliation, key checks and the version guard ask what the target holds in SQL. A lake has no SQL engine
of ours, and DuckDB's delta/iceberg extensions cannot be installed on a machine without internet; the
table format's own reader (deltalake, pyiceberg) gives an Arrow dataset of the newest version, which DuckDB
scans in place (projection and filters pushed down, nothing copied in full). Writes go through the table
format's API (loading/lake_tables.py), never through this view.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import duckdb
import pyarrow as pa
from dlt.common.data_writers.escape import escape_duckdb_literal
from dlt.destinations.exceptions import DatabaseUndefinedRelation

from ingestion_assets.loading.metadata_columns import POSITION
from ingestion_assets.loading.versions import INCOMING, KeyCheck, existing_sql, keep_newest

_READING = re.compile(r"^\s*(SELECT|WITH)\b", re.IGNORECASE)


class ReadOnlyLake(RuntimeError):
    """A statement that would change a lake's table through the SQL view; permanent, with what to do."""

    transient = False


Opener = Callable[[str], Any]  # a table name -> its Arrow dataset, or None when there is no such table


@dataclass
class LakeSqlView:
    """Quacks like the part of dlt's SQL client the readers use: execute_sql, names, literals, the connection."""

    open_dataset: Opener
    native_connection: duckdb.DuckDBPyConnection = field(default_factory=duckdb.connect)
    capabilities: Any = field(default_factory=lambda: SimpleNamespace(escape_literal=escape_duckdb_literal))
    _registered: set[str] = field(default_factory=set)

    def make_qualified_table_name(self, table: str, quote: bool = True) -> str:
        """Registers the table's dataset under its own name when it exists (a query of a missing one fails
        with DatabaseUndefinedRelation, as on a SQL target)."""
        if table not in self._registered:
            dataset = self.open_dataset(table)
            if dataset is not None:
                self.native_connection.register(table, dataset)
                self._registered.add(table)
        return self.escape_column_name(table) if quote else table

    @staticmethod
    def escape_column_name(name: str, quote: bool = True) -> str:
        return '"' + name.replace('"', '""') + '"' if quote else name

    def execute_sql(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        if not _READING.match(sql):  # a change here would change nothing, or fail as "no such table"
            self._refuse(sql.split()[0].upper())
        try:
            result = self.native_connection.execute(sql.replace("%s", "?"), list(args) if args else None)
        except duckdb.CatalogException as exc:
            if "does not exist" not in str(exc):
                raise
            raise DatabaseUndefinedRelation(exc) from exc
        return result.fetchall() if result.description else []

    def begin_transaction(self) -> Any:
        self._refuse("a transaction")

    @staticmethod
    def _refuse(what: str) -> None:
        raise ReadOnlyLake(
            f"a lake's tables are changed through their table format, not SQL: {what} is not built for this step "
            "on a lake (README, Destinations); use a DuckDB or PostgreSQL destination for it"
        )

    def close(self) -> None:
        self.native_connection.close()


@contextlib.contextmanager
def lake_sql_view(open_dataset: Opener) -> Iterator[LakeSqlView]:
    view = LakeSqlView(open_dataset)
    try:
        yield view
    finally:
        view.close()


def keep_newest_in_duckdb(
    target: Any | None,
    rows: pa.Table,
    key: tuple[str, ...],
    source: str | None = None,
    released: Collection[str] = (),
    numeric: bool = False,
) -> KeyCheck:
    """The version guard where the target's SQL cannot run versions.py's join: `target` (an Arrow dataset or
    table with the key and `_ingest_position`; None: no table yet) is joined with the slice in an in-memory
    DuckDB, which compares text versions byte by byte as sortable_text needs."""
    if target is None:
        return keep_newest(rows, None, key)
    with contextlib.closing(duckdb.connect()) as con:
        con.register("_ingest_target", target)
        con.register(INCOMING, rows.select([*key, POSITION, *([source] if source else [])]))
        found = con.sql(existing_sql("_ingest_target", key, "", source, released, numeric)).to_arrow_table()
    return keep_newest(rows, found, key)
