"""The target side's statements on MariaDB/MySQL: the key table, fetched rows as Arrow, and the deletions.

MySQL spells what DuckDB and PostgreSQL share differently: a temporary table filled by one multi-row INSERT per
chunk instead of COPY or a registered Arrow table, `UPDATE t JOIN k` and `DELETE t FROM t JOIN k` instead of
FROM/USING, and DATETIME values without a zone (they hold UTC, loading/sql_targets.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from ingestion_assets.loading.metadata_columns import DELETED_AT
from ingestion_assets.sources.postgres.introspect import TableShape
from ingestion_assets.streams.reconcile.relation import Relation, key_alias

ROWS_PER_INSERT = 1000


def quote(text: str) -> str:
    """A string literal as MySQL reads it in its default mode (backslash escapes)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def fetch(client: Any, query: str, shape: TableShape) -> pa.Table:
    """The query's rows typed as the source side's (k0.., v0..); naive DATETIMEs are UTC."""
    rows = client.execute_sql(query) or []
    schema = shape.arrow_schema
    arrays = [pa.array([row[i] for row in rows], field.type) for i, field in enumerate(schema)]
    return pa.Table.from_arrays(arrays, schema=schema)


@contextlib.contextmanager
def key_table(client: Any, relation: Relation, table: str, keys: pa.Table) -> Iterator[None]:
    """`keys` (k0, k1, ...) as the temporary table `table` on the client's connection, for the statements inside."""
    names = [key_alias(i) for i in range(len(relation.keys))]
    columns = ", ".join(f"{e.sql} AS {n}" for e, n in zip(relation.keys, names, strict=True))
    client.execute_sql(f"CREATE TEMPORARY TABLE {table} AS SELECT {columns} FROM {relation.table} t LIMIT 0")
    try:
        values = keys.select(names).to_pylist()
        for start in range(0, len(values), ROWS_PER_INSERT):
            chunk = values[start : start + ROWS_PER_INSERT]
            marks = ", ".join("(" + ", ".join(["%s"] * len(names)) + ")" for _ in chunk)
            client.execute_sql(f"INSERT INTO {table} VALUES {marks}", *[row[n] for row in chunk for n in names])
        yield
    finally:
        client.execute_sql(f"DROP TEMPORARY TABLE IF EXISTS {table}")


def retire(client: Any, relation: Relation, table: str, soft: bool) -> int:
    """Delete the rows whose key is in the key table, or flag them deleted keeping their last values."""
    on = " AND ".join(f"{e.sql} = k.{key_alias(i)}" for i, e in enumerate(relation.keys))
    if soft:
        deleted_at = client.escape_column_name(DELETED_AT)
        statement = (
            f"UPDATE {relation.table} AS t JOIN {table} AS k ON {on} SET t.{deleted_at} = UTC_TIMESTAMP(6) "
            f"WHERE {relation.live}"
        )
    else:
        statement = f"DELETE t FROM {relation.table} AS t JOIN {table} AS k ON {on}"
    with client.execute_query(statement) as cursor:
        return int(cursor.native_cursor.rowcount)
