"""Arrow slices into a PostgreSQL target without dlt's load step: dlt keeps the schema (CREATE and ALTER
from its hints and native types), our COPY + merge moves the data (see postgres_merge.py)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.loading.bindings import Marker, ensure_table, write_marker
from ingestion_assets.loading.dead_letters import record_keys
from ingestion_assets.loading.destinations import writer_lock_key
from ingestion_assets.loading.metadata_columns import POSITION
from ingestion_assets.loading.parked import dead_letter_resource, parked_keys
from ingestion_assets.loading.postgres_merge import SliceWrite, ensure_unique_key, target_columns, write_slice
from ingestion_assets.loading.versions import check_keys

if TYPE_CHECKING:
    from ingestion_assets.loading.pipeline import Loader


def load_slice(loader: Loader, table: pa.Table | None, dead_letters: pa.Table | None, disposition: str) -> int:
    """One slice (target names already applied) and its dead letters; returns the rows the target took.

    Dead letters go first (through dlt: rare, and merged on their key, so a re-read never doubles them),
    then the data and the bindings row commit together. A merge takes the writer lock only for schema work:
    ON CONFLICT applies the version guard row by row, so key-range partitions of one table load at once.
    """
    if dead_letters is not None and dead_letters.num_rows:
        with loader._lock():
            loader.pipeline.run([dead_letter_resource(dead_letters, postgres=True)])
        loader._parked_keys = None
    rows = table if table is not None and table.num_rows else None
    mode = disposition
    columns = _prepared(loader, rows)
    write = SliceWrite(
        table=_qualified(loader),
        key=loader.key,
        mode=mode,
        guard=loader.guard_versions,
        source=loader.source_column,
        released=loader.released_sources,
        keyed=loader._unique_key_known,
        bytewise=rows is not None
        and POSITION in rows.column_names
        and pa.types.is_string(rows.schema.field(POSITION).type),
        numeric=loader.target.numeric_position,
    )
    marker = _next_marker(loader)
    loaded, parked_loaded = 0, None
    with _client(loader) as client, client.begin_transaction(), client.native_connection.cursor() as cursor:
        if mode != "merge":  # the writer lock, held by this transaction: no connection of its own per slice
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s)", (writer_lock_key(loader.target.dataset, loader.stream_name),)
            )
        if rows is not None:
            parked_loaded = _parked_that_load(loader, client, rows)
            loaded = write_slice(cursor, write, rows, columns)
        if marker is not None:
            write_marker(client, loader.stream_name, loader._bound_partition, marker)
    if marker is not None:
        loader.bound = marker
    if parked_loaded is not None and parked_loaded.num_rows:
        loader._release_parked(parked_loaded)
    return loaded


def _prepared(loader: Loader, rows: pa.Table | None) -> list[str]:
    """The target's columns once the slice's are all there: dlt creates or alters the table from an empty
    slice with the same hints (native types, key) as a load; a merge target also gets its unique key."""
    if rows is None and loader.bound is None:
        return []
    qualified = _qualified(loader)
    with _client(loader) as client, client.native_connection.cursor() as cursor:
        columns = target_columns(cursor, qualified)
        keyed = not _merged(loader) or loader._unique_key_known
        ready = rows is None or (set(rows.column_names) <= set(columns) and keyed)
        if ready and (loader.bound is None or loader._bindings_known):
            return columns
    with loader._lock():
        with _client(loader) as client, client.native_connection.cursor() as cursor:
            columns = target_columns(cursor, qualified)
        if rows is not None and not set(rows.column_names) <= set(columns):
            import dlt  # a new table or new columns: dlt's schema makes them

            from ingestion_assets.loading.postgres_copy import LOADER_FILE_FORMAT

            empty = dlt.resource([rows.slice(0, 0)], **loader._resource_hints("append"))
            loader.pipeline.run([empty], loader_file_format=LOADER_FILE_FORMAT)
        with _client(loader) as client, client.native_connection.cursor() as cursor:
            columns = target_columns(cursor, qualified)
            if rows is not None and _merged(loader):  # with its first rows: an index on an empty table is free
                ensure_unique_key(cursor, qualified, loader.target.table, loader.key)
                loader._unique_key_known = True
            if loader.bound is not None:
                ensure_table(client)  # here, not in the slice's transaction: two first writers would collide
                loader._bindings_known = True
    return columns


def _merged(loader: Loader) -> bool:
    """A stream merged on its key (also while its first full read appends)."""
    return loader.target.write_disposition == "merge" and bool(loader.key)


def _next_marker(loader: Loader) -> Marker | None:
    if loader.bound is None:
        return None
    return Marker(loader.bound.binding, loader.bound.seq + 1, loader.bound.generation)


def _parked_that_load(loader: Loader, client: Any, rows: pa.Table) -> pa.Table | None:
    """The slice's rows whose key waits in the dead-letter table and that the target now takes (not stale):
    they leave it after the commit. Asked only for those keys, inside the slice's transaction."""
    if loader._parked_keys is None:
        loader._parked_keys = parked_keys(loader, loader.stream_name)
    if not loader._parked_keys:
        return None
    keys = record_keys(rows, loader.key)
    candidates = rows.filter(pc.is_in(keys, pa.array(sorted(loader._parked_keys))))
    if not candidates.num_rows or not loader.guard_versions:
        return candidates
    target = loader.target
    return check_keys(
        client,
        "postgres",
        target.table,
        loader.key,
        candidates,
        loader.source_column,
        loader.released_sources,
        target.numeric_position,
    ).rows


def _client(loader: Loader) -> Any:
    """One dlt SQL client per loader, on one connection kept open across its slices (closed with the loader):
    resolving dlt's configuration for a new client, and opening a connection per statement group, each cost
    more than the slice's merge statement on a small slice. A connection that broke is opened again."""
    client = loader._sql_client
    if client is None:
        client = loader._sql_client = loader.sql_client()
        weakref.finalize(loader, client.close_connection)
    connection = client._conn
    if connection is None or connection.closed:
        client.open_connection()
        client.owns_connection = False  # `with client` reuses it instead of opening and closing one
    return client


def _qualified(loader: Loader) -> str:
    return str(_client(loader).make_qualified_table_name(loader.target.table))
