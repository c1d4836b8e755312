"""CDC streams whose table has a column that cannot land in the target: named like a column the product writes
itself (`_ingest_position`, `_dlt_id`, ...), or landing under one name with another column. That stream alone is
left out of the run before its table is published or any change of it is read; the others go on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from psycopg2 import sql

from ingestion_assets.loading.destinations import target_names
from ingestion_assets.loading.naming import NameCollision
from ingestion_assets.sources.postgres.cdc import TableName, drop_unread_tables, parse_lsn
from ingestion_assets.sources.postgres.reader import connect
from ingestion_assets.streams.cdc.outcome import CdcError
from ingestion_assets.streams.cdc.paused import PAUSED

if TYPE_CHECKING:
    from ingestion_assets.streams.cdc.sync import CdcSync

_COLUMNS_SQL = """
SELECT coalesce(array_agg(attname::text ORDER BY attnum), '{}') FROM pg_attribute
WHERE attrelid = to_regclass(%(table)s) AND attnum > 0 AND NOT attisdropped
"""


def refuse_unlandable(sync: CdcSync, url: str, stored: dict[str, Any]) -> dict[str, str]:
    """Leave out each stream whose table's columns cannot land in the target, saying why; returns the messages.
    A stream that holds a position (a column added by DDL while it ran) is paused: its checkpoint keeps no
    position, so once the column is renamed its table is copied again and nothing of the pause is lost. Its
    table leaves the product's own publication, so the slot decodes none of its changes meanwhile."""
    names = target_names(sync.destination)
    columns = table_columns(url, sync.tables())
    refused: dict[str, str] = {}
    for stream in sync.streams:
        table = (stream.spec.schema_name, stream.spec.table_name)
        where = f"stream {stream.qualified_name} (table {'.'.join(table)})"
        try:
            names.check(where, columns.get(table, []), views=False)  # a missing table: the checks after this name it
        except NameCollision as exc:
            refused[stream.name] = _message(sync, str(exc), held=_held(stored.get(stream.name)))
    if not refused:
        return {}
    for name, message in refused.items():
        sync._say("%s", message)
        checkpoint = stored.get(name) or {}
        if _held(checkpoint):  # a pause stored already keeps no position: nothing more to store
            sync.store.commit(parse_lsn(str(checkpoint["lsn"])), {name: {"snapshot_done": False, PAUSED: message}})
    _leave_out(sync, url, refused)
    if not sync.streams:
        raise CdcError("; ".join(refused.values()))
    return refused


def pause_copied(sync: CdcSync, url: str, paused: dict[str, str]) -> None:
    """Streams whose copy beside the log met a column that cannot land (added while it ran; `paused`: stream ->
    what cannot land): nothing of that range was loaded. Each is paused at once, as the next run's checks
    would pause it (its checkpoint keeps no position, its table leaves the product's publication), and the
    run goes on with the other streams."""
    for name, problem in paused.items():
        message = _message(sync, problem, held=True)
        sync._say("%s", message)
        position = sync._state.positions.pop(name, None)
        sync._state.copies.pop(name, None)
        if position is not None:
            sync.store.commit(position, {name: {"snapshot_done": False, PAUSED: message}})
        sync.refused[name] = message
    _leave_out(sync, url, paused)


def _leave_out(sync: CdcSync, url: str, refused: dict[str, str]) -> None:
    """The run goes on without these streams; the product's own publication drops their tables."""
    sync.streams = [s for s in sync.streams if s.name not in refused]
    if sync.source.cdc.publication is None:
        read = [(s.schema_name, s.table_name) for n, s in sync.source.streams.items() if n not in refused]
        drop_unread_tables(url, sync.publication, read)


def table_columns(url: str, tables: Sequence[TableName]) -> dict[TableName, list[str]]:
    """Each table's columns (generated ones too: they are loaded) by (schema, table); a missing table has none."""
    conn = connect(url, "ingest-cdc-columns")
    try:
        found: dict[TableName, list[str]] = {}
        with conn.cursor() as cur:
            for table in tables:
                cur.execute(_COLUMNS_SQL, {"table": sql.Identifier(*table).as_string(conn)})
                found[table] = list(cur.fetchone()[0])
        return found
    finally:
        conn.close()


def _held(checkpoint: dict[str, Any] | None) -> bool:
    return bool(checkpoint and checkpoint.get("snapshot_done") and checkpoint.get("lsn"))


def _message(sync: CdcSync, problem: str, held: bool) -> str:
    published = (
        f"its table was taken out of the product's publication {sync.publication}"
        if sync.source.cdc.publication is None
        else f"its changes in publication {sync.publication} are left aside"
    )
    done = (
        f"it is paused: its checkpoint keeps no log position and {published}"
        if held
        else "it is left out of this run: its table is not published, nothing of it is read or stored"
    )
    return (
        f"{problem} (CDC reads tables, not views), or take the stream out of the catalog. Meanwhile {done}; "
        f"the other streams of source {sync.source_name} go on. Once its columns can land, the next run publishes "
        "the table and copies it"
    )
