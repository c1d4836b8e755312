"""Rows of a time-partitioned table that no time window reads: before the first window, at or past the end of the
newest one (future-dated), or with no value in the partition column. Counted with one statement whose three
conditions a btree index on the column serves (`<`, `>=`, `IS NULL`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg2 import sql

from ingestion_assets.sources.postgres.query import ReadPlan, Window, exact_text


@dataclass(frozen=True)
class Outside:
    before: int  # rows with the column before the first window's start
    earliest: str | None  # the lowest such value
    after: int  # rows at or past the end of the newest window (future-dated)
    latest: str | None  # the highest such value
    null: int  # rows with no value in the column


def rows_outside(conn: Any, plan: ReadPlan, column: str, start: str, end: str) -> Outside:
    """Count the rows of `plan`'s table whose `column` is before `start`, at or after `end`, or NULL."""
    ident = sql.SQL("t.") + sql.Identifier(plan.shape.column(column).name)
    (before,) = plan.window_conditions(Window(column, upper=start))
    (after,) = plan.window_conditions(Window(column, lower=end))
    null = sql.SQL("{} IS NULL").format(ident)
    query = sql.SQL(
        "SELECT count(*) FILTER (WHERE {before}), min({c}), count(*) FILTER (WHERE {after}), max({c}), "
        "count(*) FILTER (WHERE {null}) FROM {table} t WHERE {before} OR {after} OR {null}"
    ).format(before=before, after=after, null=null, c=ident, table=sql.Identifier(plan.shape.schema, plan.shape.table))
    with conn.cursor() as cur:
        cur.execute(query)
        n_before, earliest, n_after, latest, n_null = cur.fetchone()
    return Outside(
        before=int(n_before),
        earliest=exact_text(earliest) if n_before else None,
        after=int(n_after),
        latest=exact_text(latest) if n_after else None,
        null=int(n_null),
    )


def column_indexed(conn: Any, schema: str, table: str, column: str) -> bool:
    """Whether a btree index (of the table or, partitioned, of its parent) leads with `column`: the count is then
    a few index probes, not a scan of the table."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_am am ON am.oid = c.relam JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = i.indkey[0] WHERE i.indrelid = to_regclass(quote_ident(%s) || '.' || quote_ident(%s)) "
            "AND am.amname = 'btree' AND a.attname = %s AND i.indpred IS NULL)",
            (schema, table, column),
        )
        row = cur.fetchone()
    return bool(row and row[0])
