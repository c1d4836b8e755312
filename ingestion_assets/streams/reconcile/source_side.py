"""The source side of a reconciliation: the table's rows in scope, read from PostgreSQL, never written.

Aggregates run as one query; rows of differing buckets and rows looked up by key stream through COPY into
Arrow like every other read. Keys to look up travel as a VALUES list: nothing is created on the source.
Every read of one reconciliation sees one exported snapshot, so a row updated between the aggregate and
the diff cannot look absent (and be deleted from the target) while the source still has it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator

import pyarrow as pa
from psycopg2 import sql
from psycopg2.extensions import connection as PgConnection

from ingestion_assets.sources.postgres.introspect import Column, TableShape
from ingestion_assets.sources.postgres.query import ReadPlan, exact_text
from ingestion_assets.sources.postgres.reader import connect, copy_batches
from ingestion_assets.sources.postgres.temporal import TEMPORAL
from ingestion_assets.sources.postgres.values import from_text, plain
from ingestion_assets.streams.reconcile.canonical import Dialect, Expr, NotComparable, key_kind, kind_of
from ingestion_assets.streams.reconcile.relation import (
    Buckets,
    Relation,
    Scope,
    fold,
    key_alias,
    version_alias,
    work_mem,
)

APPLICATION = "ingest-reconcile"
KEYS_PER_LOOKUP = 1000


@dataclasses.dataclass
class SourceSide:
    url: str
    plan: ReadPlan
    scope: Scope
    conn: PgConnection  # in a read-only repeatable-read transaction that exported `snapshot`
    snapshot: str
    target: Dialect  # the other side's: a key is compared by the identity the target gives it (canonical.py)

    @classmethod
    @contextlib.contextmanager
    def open(cls, url: str, plan: ReadPlan, scope: Scope, target: Dialect) -> Iterator[SourceSide]:
        conn = connect(url, APPLICATION)
        try:
            with conn.cursor() as cur:
                cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                cur.execute("SELECT pg_export_snapshot()")
                (snapshot,) = cur.fetchone() or ("",)
            yield cls(url, plan, scope, conn, str(snapshot), target)
        finally:
            conn.close()

    @functools.cached_property
    def relation(self) -> Relation:
        window = self.scope.window
        return Relation(
            dialect="postgres",
            table=sql.Identifier(self.plan.shape.schema, self.plan.shape.table).as_string(self.conn),
            keys=tuple(self._expr(name, key=True) for name in self.plan.primary_key),
            versions=tuple(self._expr(name) for name in self.plan.cursor),
            window_column=self._expr(window.column) if window is not None else None,
            quote=lambda text: sql.Literal(text).as_string(self.conn),
        )

    def _expr(self, name: str, key: bool = False) -> Expr:
        column = self.plan.shape.column(name)
        ident = "t." + sql.Identifier(name).as_string(self.conn)
        kind = key_kind(column, self.target) if key else kind_of(column)
        return Expr(ident, kind, column.nullable, column.sql_type)

    @functools.cached_property
    def shape(self) -> TableShape:
        """The columns a fetch returns, named k0.., v0.., typed as the stream reads them."""
        keys = [self._renamed(name, key_alias(i)) for i, name in enumerate(self.plan.primary_key)]
        versions = [self._renamed(name, version_alias(i)) for i, name in enumerate(self.plan.cursor)]
        return TableShape(self.plan.shape.schema, self.plan.shape.table, tuple(keys + versions))

    def _renamed(self, name: str, alias: str) -> Column:
        """Temporal columns travel as text and are parsed as the read parses them, so ±infinity, BC and years
        past 9999 (which Arrow's CSV reader rejects) compare as the values the target holds."""
        column = self.plan.shape.column(name)
        return dataclasses.replace(column, name=alias, decode="temporal" if column.kind in TEMPORAL else column.decode)

    def estimate(self) -> int:
        """About how many rows the table holds: it sizes the buckets, nothing more."""
        with self.conn.cursor() as cur:
            cur.execute(self.relation.estimate_sql)
            row = cur.fetchone()
        return int(row[0]) if row else 0

    def aggregate(self, buckets: int) -> Buckets:
        """One query; its hash table gets the memory it needs (in this transaction only) instead of spilling."""
        with self.conn.cursor() as cur:
            cur.execute(f"SET LOCAL work_mem = {work_mem(buckets)}")
            cur.execute(self.relation.aggregate_sql(self.scope, buckets))
            return fold(cur.fetchall())

    def rows(self, buckets: int, only: list[int] | None) -> pa.Table:
        return self._copy(self.relation.rows_sql(self.scope, buckets, only))

    def lookup(self, keys: pa.Table) -> pa.Table:
        """The rows (any version, any window) whose key is one of `keys` (columns k0, k1, ...)."""
        relation = self.relation
        found = [fetched(self.shape, [])]
        names = [key_alias(i) for i in range(len(relation.keys))]
        for start in range(0, keys.num_rows, KEYS_PER_LOOKUP):
            part = keys.slice(start, KEYS_PER_LOOKUP).select(names)  # plain: ±infinity and BC as PostgreSQL's text
            chunk = [{n: plain(part.column(n)[i]) for n in names} for i in range(part.num_rows)]
            values = ", ".join(
                "(" + ", ".join(self._literal(e, row[n]) for e, n in zip(relation.keys, names, strict=True)) + ")"
                for row in chunk
            )
            found.append(self._copy(relation.rows_with_keys_sql(f"(VALUES {values}) AS k({', '.join(names)})")))
        return pa.concat_tables(found)

    def _literal(self, expr: Expr, value: object) -> str:
        text = exact_text(value)
        return "NULL" if text is None else f"CAST({sql.Literal(text).as_string(self.conn)} AS {expr.cast})"

    def _copy(self, query: str) -> pa.Table:
        statement = f"COPY ({query}) TO STDOUT WITH (FORMAT csv)"
        batches = copy_batches(self.url, statement, self.shape, APPLICATION, snapshot=self.snapshot)
        return parsed_temporals(fetched(self.shape, list(batches)), self.shape)


def parsed_temporals(table: pa.Table, shape: TableShape) -> pa.Table:
    """Temporal columns fetched as text (see _renamed) as their values; a text no value holds fails the check."""
    for column in shape.columns:
        if column.decode != "temporal" or not pa.types.is_string(table.schema.field(column.name).type):
            continue
        values, problems = from_text(table.column(column.name).combine_chunks(), column)
        if problems:
            why = next(iter(problems.values()))
            raise NotComparable(f"{shape.schema}.{shape.table}: a value cannot be compared: {why}")
        table = table.set_column(table.schema.get_field_index(column.name), column.name, values)
    return table


def fetched(shape: TableShape, batches: list[pa.RecordBatch]) -> pa.Table:
    """One table from COPY batches, every field nullable, so fetches of one side always concatenate."""
    table = pa.Table.from_batches(batches) if batches else shape.arrow_schema.empty_table()
    return pa.table(table.columns, names=table.column_names)
