"""Newest version wins whatever the arrival order: drop incoming rows the target already holds newer."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ingestion_assets.loading.metadata_columns import POSITION

_INCOMING = "_ingest_incoming"


def drop_stale_rows(
    client: Any, destination_type: str, table: str, primary_key: tuple[str, ...], rows: pa.Table
) -> pa.Table:
    """Remove rows whose key is in `table` at a higher `_ingest_position`. Call under the writer lock.

    Partitions of one stream and its live tail write the same table in any order; a history chunk read
    before an update must not overwrite the update that already landed.
    """
    keys = rows.select([*primary_key, POSITION])
    qualified = client.make_qualified_table_name(table)
    if not _table_exists(client, table):
        return rows
    if destination_type == "duckdb":
        stale = _stale_keys_duckdb(client.native_connection, qualified, primary_key, keys)
    else:
        stale = _stale_keys_postgres(client.native_connection, qualified, primary_key, keys)
    if stale.num_rows == 0:
        return rows
    if len(primary_key) == 1:
        return rows.filter(pc.invert(pc.is_in(rows[primary_key[0]], value_set=stale[primary_key[0]])))
    return rows.join(stale, keys=list(primary_key), join_type="left anti")


def _stale_sql(qualified: str, primary_key: tuple[str, ...]) -> str:
    using = ", ".join(f'"{k}"' for k in primary_key)
    columns = ", ".join(f'i."{k}"' for k in primary_key)
    return f"SELECT {columns} FROM {_INCOMING} i JOIN {qualified} t USING ({using}) WHERE t.{POSITION} > i.{POSITION}"


def _stale_keys_duckdb(con: Any, qualified: str, primary_key: tuple[str, ...], keys: pa.Table) -> pa.Table:
    con.register(_INCOMING, keys)
    try:
        result: pa.Table = con.sql(_stale_sql(qualified, primary_key)).to_arrow_table()
        return result
    finally:
        con.unregister(_INCOMING)


def _stale_keys_postgres(conn: Any, qualified: str, primary_key: tuple[str, ...], keys: pa.Table) -> pa.Table:
    import io

    columns = ", ".join(f'"{k}"' for k in primary_key)
    buffer = io.BytesIO()
    pacsv.write_csv(keys, buffer, write_options=pacsv.WriteOptions(include_header=False))
    buffer.seek(0)
    with conn.cursor() as cur:
        cur.execute(f"CREATE TEMP TABLE {_INCOMING} AS SELECT {columns}, {POSITION} FROM {qualified} LIMIT 0")
        try:
            cur.copy_expert(f"COPY {_INCOMING} FROM STDIN WITH (FORMAT csv)", buffer)
            cur.execute(_stale_sql(qualified, primary_key))
            found = cur.fetchall()
        finally:
            cur.execute(f"DROP TABLE IF EXISTS {_INCOMING}")
    arrays = [pa.array([row[i] for row in found]) for i in range(len(primary_key))]
    return pa.table(arrays, names=list(primary_key)).cast(keys.select(list(primary_key)).schema)


def _table_exists(client: Any, table: str) -> bool:
    from dlt.destinations.exceptions import DatabaseUndefinedRelation

    try:
        client.execute_sql(f"SELECT 1 FROM {client.make_qualified_table_name(table)} LIMIT 0")
    except DatabaseUndefinedRelation:
        return False
    return True
