"""The target side of a reconciliation: live rows of the stream's table in DuckDB or PostgreSQL, and the
deletions a full comparison applies there.

Column names are the target's: dlt normalises the source's names (snake_case), so every name goes through
the pipeline's naming convention and the client's quoting. Soft-deleted rows (`_ingest_deleted_at` set)
are not live: they count as absent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from ingestion_assets.loading.dead_letters import NULL_KEY, key_part, key_values
from ingestion_assets.loading.destinations import destination_url
from ingestion_assets.loading.metadata_columns import DELETED_AT, POSITION
from ingestion_assets.loading.parked import parked_keys_in
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.loading.target_sql import undefined_relation
from ingestion_assets.sources.postgres.introspect import TableShape
from ingestion_assets.sources.postgres.query import ReadPlan
from ingestion_assets.sources.postgres.reader import SESSION_SETTINGS, csv_options
from ingestion_assets.streams.reconcile import target_mysql
from ingestion_assets.streams.reconcile.canonical import (
    Dialect,
    Expr,
    NotComparable,
    key_kind,
    kind_of,
    mysql_cast,
    number_text,
)
from ingestion_assets.streams.reconcile.relation import (
    Buckets,
    Relation,
    Scope,
    fold,
    key_alias,
    work_mem,
)
from ingestion_assets.streams.reconcile.source_side import parsed_temporals

KEYS_TABLE = "_ingest_reconcile_keys"


COMPARED = ("duckdb", "postgres", "filesystem")  # SQL the canonical forms are written in (a lake: DuckDB's view)


def target_dialect(loader: Loader) -> Dialect | None:
    kind = loader.destination.type
    if kind == "postgres":
        return "postgres"
    if kind in ("duckdb", "filesystem"):
        return "duckdb"
    if kind != "sqlalchemy":
        return None
    from ingestion_assets.loading.sql_targets import is_mysql  # dlt's sqlalchemy destination: imported for it only

    return "mysql" if is_mysql(destination_url(loader.settings, loader.destination)) else None


def comparable_target(loader: Loader) -> Dialect:
    """Reconciliation compares canonical SQL forms on both sides; elsewhere it says it was skipped and why."""
    destination = loader.destination
    dialect = target_dialect(loader)
    if dialect is None:
        raise NotComparable(
            f"stream {loader.target.dataset}.{loader.stream_name}: `reconcile` is not run on a {destination.type} "
            "target (its checksums are written in DuckDB's, PostgreSQL's and MySQL's SQL): deletes the polling "
            "cannot see are not found there; use `mode: cdc` for them, or a DuckDB, PostgreSQL, MariaDB or lake "
            "destination, or set `reconcile: off` (README, Destinations)"
        )
    return dialect


@dataclasses.dataclass
class TargetSide:
    loader: Loader
    plan: ReadPlan
    scope: Scope
    shape: TableShape  # the columns a fetch returns (k0.., v0..), typed as the source side reads them
    client: Any  # an open dlt SQL client, under the writer lock (Loader.client)

    @functools.cached_property
    def relation(self) -> Relation:
        client = self.client
        dialect = comparable_target(self.loader)
        mysql = dialect == "mysql"

        def expr(source_name: str, target_name: str | None = None, key: bool = False) -> Expr:
            column = self.plan.shape.column(source_name)
            name = client.escape_column_name(target_name or self.loader.names.column(source_name))
            kind = key_kind(column, dialect) if key else kind_of(column)
            return Expr(f"t.{name}", kind, column.nullable, mysql_cast(kind) if mysql else kind.target_type)

        cursor = self.plan.cursor
        # One cursor column: the row's version is `_ingest_position`, typed like it (the loader's version guard
        # compares the same column); several: the target's cursor columns, since the position is then a text.
        versions = (expr(cursor[0], POSITION),) if len(cursor) == 1 else tuple(expr(c) for c in cursor)
        window = self.scope.window
        # a numeric's text (DuckDB, a PostgreSQL position) is bounded by its value; MySQL's SQL has no split_part
        numbers = () if mysql else (i for i, name in enumerate(cursor) if self.plan.shape.column(name).is_numeric_text)
        return Relation(
            dialect=dialect,  # a lake: DuckDB's view of it
            table=client.make_qualified_table_name(self.loader.target.table),
            keys=tuple(expr(k, key=True) for k in self.plan.primary_key),
            versions=versions,
            window_column=expr(window.column) if window is not None else None,
            quote=target_mysql.quote if mysql else client.capabilities.escape_literal,
            live=f"t.{client.escape_column_name(DELETED_AT)} IS NULL",
            numbers=frozenset(numbers),
            collate=' COLLATE "C"' if dialect == "postgres" else "",
        )

    @functools.cached_property
    def exists(self) -> bool:
        """No table yet (every row parked, or nothing loaded): the target side is empty."""
        try:
            self.client.execute_sql(f"SELECT 1 FROM {self.relation.table} LIMIT 0")
        except undefined_relation():
            return False
        return True

    def estimate(self) -> int:
        if not self.exists:
            return 0
        rows = self.client.execute_sql(self.relation.estimate_sql)
        return int(rows[0][0]) if rows else 0

    def aggregate(self, buckets: int) -> Buckets:
        if not self.exists:
            return {}
        if self.relation.dialect == "postgres":  # as on the source: the hash table fits in memory
            self.client.execute_sql(f"SET work_mem = {work_mem(buckets)}")
        return fold(self.client.execute_sql(self.relation.aggregate_sql(self.scope, buckets)) or [])

    def rows(self, buckets: int, only: list[int] | None) -> pa.Table:
        if not self.exists:
            return _empty(self.shape)
        return self._fetch(self.relation.rows_sql(self.scope, buckets, only))

    def lookup(self, keys: pa.Table) -> pa.Table:
        """Live rows (any version, any window) whose key is one of `keys` (columns k0, k1, ...)."""
        if keys.num_rows == 0 or not self.exists:
            return _empty(self.shape)
        with self._keys(keys):
            return self._fetch(self.relation.rows_with_keys_sql(f"{KEYS_TABLE} AS k"))

    def retire(self, keys: pa.Table, soft: bool) -> int:
        """Delete the rows of `keys`, or mark them deleted keeping their last values; returns how many."""
        if keys.num_rows == 0:
            return 0
        if self.loader.destination.is_lake:  # the view is read-only: the table format's own MERGE
            from ingestion_assets.loading.lake import LakeLoader

            assert isinstance(self.loader, LakeLoader)
            names = [key_alias(i) for i in range(len(self.loader.key))]
            return self.loader.retire_keys(keys.select(names).rename_columns(list(self.loader.key)), soft)
        relation = self.relation
        if relation.dialect == "mysql":
            with self._keys(keys):
                return target_mysql.retire(self.client, relation, KEYS_TABLE, soft)
        on = " AND ".join(f"{e.sql} = k.{key_alias(i)}" for i, e in enumerate(relation.keys))
        if soft:
            deleted_at = self.client.escape_column_name(DELETED_AT)
            statement = (
                f"UPDATE {relation.table} AS t SET {deleted_at} = CURRENT_TIMESTAMP FROM {KEYS_TABLE} AS k "
                f"WHERE {on} AND {relation.live}"
            )
        else:
            statement = f"DELETE FROM {relation.table} AS t USING {KEYS_TABLE} AS k WHERE {on}"
        with self._keys(keys):
            if relation.dialect == "duckdb":
                return int(self.client.native_connection.execute(statement).fetchone()[0])
            with self.client.native_connection.cursor() as cur:
                cur.execute(statement)
                return int(cur.rowcount)

    def parked(self) -> set[str]:
        """The parked rows' keys as the comparison spells them: a `number` part without trailing zeros."""
        parked = parked_keys_in(self.client, self.loader.stream_name)
        numbers = [e.kind.name == "number" for e in self.relation.keys]
        if not any(numbers):
            return parked
        return {_number_parts(key, numbers) for key in parked}

    @contextlib.contextmanager
    def _keys(self, keys: pa.Table) -> Iterator[None]:
        """`keys` as the relation KEYS_TABLE for one statement: registered in DuckDB, a temp table in PostgreSQL."""
        if self.relation.dialect == "mysql":
            with target_mysql.key_table(self.client, self.relation, KEYS_TABLE, keys):
                yield
            return
        names = [key_alias(i) for i in range(len(self.relation.keys))]
        keys, conn = keys.select(names), self.client.native_connection
        if self.relation.dialect == "duckdb":
            conn.register(KEYS_TABLE, keys)
            try:
                yield
            finally:
                conn.unregister(KEYS_TABLE)
            return
        columns = ", ".join(f"{e.sql} AS {n}" for e, n in zip(self.relation.keys, names, strict=True))
        buffer = io.BytesIO()
        pacsv.write_csv(keys, buffer, write_options=pacsv.WriteOptions(include_header=False))
        buffer.seek(0)
        with conn.cursor() as cur:
            cur.execute(f"CREATE TEMP TABLE {KEYS_TABLE} AS SELECT {columns} FROM {self.relation.table} t LIMIT 0")
            try:
                cur.copy_expert(f"COPY {KEYS_TABLE} FROM STDIN WITH (FORMAT csv)", buffer)
                yield
            finally:
                cur.execute(f"DROP TABLE IF EXISTS {KEYS_TABLE}")

    def _fetch(self, query: str) -> pa.Table:
        if self.relation.dialect == "mysql":
            return target_mysql.fetch(self.client, query, self.shape)
        if self.relation.dialect == "duckdb":
            table: pa.Table = self.client.native_connection.sql(query).to_arrow_table()
            return pa.table(table.columns, names=table.column_names)
        return _copy_postgres(self.client.native_connection, query, self.shape)


def _number_parts(key: str, numbers: list[bool]) -> str:
    """A dead letter's key text (record_keys) with its number parts as the comparison spells them."""
    values = key_values(key)
    if len(values) != len(numbers):
        return key
    parts = [
        NULL_KEY if value is None else key_part(number_text(value) if number else value)
        for value, number in zip(values, numbers, strict=True)
    ]
    return "|".join(parts)


def _copy_postgres(conn: Any, query: str, shape: TableShape) -> pa.Table:
    """COPY on the client's own session (it sees the temp key table), parsed with the source's types."""
    buffer = io.BytesIO()
    with conn.cursor() as cur:
        for statement in SESSION_SETTINGS:
            cur.execute(statement)
        cur.copy_expert(f"COPY ({query}) TO STDOUT WITH (FORMAT csv)", buffer)
    if buffer.tell() == 0:
        return _empty(shape)
    buffer.seek(0)
    table = pacsv.read_csv(buffer, **csv_options(shape))
    for index, column in enumerate(shape.columns):
        if pa.types.is_binary(column.arrow_type):  # bytea arrives as \x... text
            values = [None if v is None else bytes.fromhex(v[2:]) for v in table.column(index).to_pylist()]
            table = table.set_column(index, column.name, pa.array(values, pa.binary()))
    return parsed_temporals(pa.table(table.columns, names=table.column_names), shape)


def _empty(shape: TableShape) -> pa.Table:
    table = shape.arrow_schema.empty_table()
    return pa.table(table.columns, names=table.column_names)
