"""Newest version wins whatever the arrival order: compare an incoming slice's keys with the target.

Partitions of one stream and its live tail write the same table in any order; a history chunk read
before an update must not overwrite the update that already landed. Call under the writer lock.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ingestion_assets.loading.metadata_columns import POSITION
from ingestion_assets.loading.native_types import for_postgres
from ingestion_assets.loading.relations import table_exists

_INCOMING = "_ingest_incoming"
_ROW = "_ingest_row"
STALE = "_ingest_stale"


@dataclass(frozen=True)
class KeyCheck:
    rows: pa.Table  # the slice without its stale rows
    existing: int  # how many of its keys the target already holds (0: the slice can be appended)


def check_keys(
    client: Any, destination_type: str, table: str, primary_key: tuple[str, ...], rows: pa.Table
) -> KeyCheck:
    found = existing_keys(client, destination_type, table, primary_key, rows.select([*primary_key, POSITION]))
    if found is None:
        return KeyCheck(rows, 0)
    stale = found.filter(found[STALE]).select(list(primary_key))
    if stale.num_rows == 0:
        return KeyCheck(rows, found.num_rows)
    if len(primary_key) == 1:
        kept = rows.filter(pc.invert(pc.is_in(rows[primary_key[0]], value_set=stale[primary_key[0]])))
    else:  # joined on the keys alone: Arrow's join carries no list columns
        keys = rows.select(list(primary_key)).append_column(_ROW, pa.array(range(rows.num_rows), pa.int64()))
        fresh = keys.join(stale, keys=list(primary_key), join_type="left anti").column(_ROW)
        kept = rows.take(pc.take(fresh, pc.sort_indices(fresh)))  # in their order
    return KeyCheck(kept, found.num_rows)


def existing_keys(
    client: Any, destination_type: str, table: str, primary_key: tuple[str, ...], keys: pa.Table
) -> pa.Table | None:
    """The keys of `keys` (primary key + `_ingest_position`) the target holds, each with `STALE`: whether the
    target's version is newer. None when the target table does not exist yet."""
    if not table_exists(client, client.make_qualified_table_name(table)):
        return None
    qualified = client.make_qualified_table_name(table)
    statement = _existing_sql(qualified, primary_key)
    if destination_type == "duckdb":
        return _query_duckdb(client.native_connection, statement, keys)
    return _query_postgres(client.native_connection, statement, qualified, primary_key, keys)


def _existing_sql(qualified: str, primary_key: tuple[str, ...]) -> str:
    using = ", ".join(_quote(k) for k in primary_key)
    columns = ", ".join(f"i.{_quote(k)}" for k in primary_key)
    return (
        f"SELECT {columns}, t.{POSITION} > i.{POSITION} AS {STALE} "
        f"FROM {_INCOMING} i JOIN {qualified} t USING ({using})"
    )


def _query_duckdb(con: Any, statement: str, keys: pa.Table) -> pa.Table:
    con.register(_INCOMING, keys)
    try:
        result: pa.Table = con.sql(statement).to_arrow_table()
        return result
    finally:
        con.unregister(_INCOMING)


def _query_postgres(
    conn: Any, statement: str, qualified: str, primary_key: tuple[str, ...], keys: pa.Table
) -> pa.Table:
    columns = ", ".join(_quote(k) for k in primary_key)
    buffer = io.BytesIO()
    pacsv.write_csv(for_postgres(keys), buffer, write_options=pacsv.WriteOptions(include_header=False))
    buffer.seek(0)
    with conn.cursor() as cur:
        cur.execute(f"CREATE TEMP TABLE {_INCOMING} AS SELECT {columns}, {POSITION} FROM {qualified} LIMIT 0")
        try:
            cur.copy_expert(f"COPY {_INCOMING} FROM STDIN WITH (FORMAT csv)", buffer)
            cur.execute(statement)
            found = cur.fetchall()
        finally:
            cur.execute(f"DROP TABLE IF EXISTS {_INCOMING}")
    names = [*primary_key, STALE]
    arrays = [pa.array([row[i] for row in found]) for i in range(len(names))]
    schema = pa.schema([*keys.select(list(primary_key)).schema, pa.field(STALE, pa.bool_())])
    return pa.table(arrays, names=names).cast(schema)


def _quote(name: str) -> str:
    """A double-quoted identifier, as both DuckDB and PostgreSQL read it."""
    return '"' + name.replace('"', '""') + '"'


