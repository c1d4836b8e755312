"""The target's side of a checkpoint: which stream, partition, binding and generation a target holds.

A checkpoint names the binding (an id made when a stream starts loading into a target) and how many
slices it committed there. After every committed load the target records the same, in its own table
`_ingest_bindings`, *after* the data and *before* the checkpoint. A run whose target has no such row, a
different binding or fewer slices than its checkpoint (a new destination or file, a dropped schema, a
target restored from an older backup) is not continuing the data it believes it is: it must re-read.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from ingestion_assets.loading.target_sql import is_postgres_client, undefined_relation

TABLE = "_ingest_bindings"
_DDL_LOCK = 0x1D6E57  # pg_advisory_xact_lock key of the bindings table's creation
_COLUMNS = "stream, partition_key, binding, seq, generation, updated_at"


@dataclass(frozen=True)
class Marker:
    """What the target says it holds for one stream partition."""

    binding: str
    seq: int  # slices committed under this binding
    generation: int


def read_marker(client: Any, stream: str, partition: str | None) -> Marker | None:
    table = client.make_qualified_table_name(TABLE)
    try:
        rows = client.execute_sql(
            f"SELECT binding, seq, generation FROM {table} WHERE stream = %s AND partition_key = %s",
            stream,
            partition or "",
        )
    except undefined_relation():
        return None
    if not rows:
        return None
    binding, seq, generation = rows[0]
    return Marker(str(binding), int(seq), int(generation))


def write_marker(client: Any, stream: str, partition: str | None, marker: Marker) -> None:
    """Upsert the stream partition's row (the dataset exists: a load just went into it)."""
    table = ensure_table(client)
    mysql = _is_mysql(client)
    upsert = (
        "ON DUPLICATE KEY UPDATE binding = VALUES(binding), seq = VALUES(seq), generation = VALUES(generation), "
        "updated_at = VALUES(updated_at)"
        if mysql
        else "ON CONFLICT (stream, partition_key) DO UPDATE SET binding = excluded.binding, seq = excluded.seq, "
        "generation = excluded.generation, updated_at = excluded.updated_at"
    )
    now = dt.datetime.now(dt.UTC)
    client.execute_sql(
        f"INSERT INTO {table} ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s) {upsert}",
        stream,
        partition or "",
        marker.binding,
        marker.seq,
        marker.generation,
        now.replace(tzinfo=None) if mysql else now,  # MySQL's DATETIME holds UTC without a zone
    )


def set_generation(client: Any, stream: str, generation: int) -> None:
    """A refresh swapped a new generation in (call inside the swap's transaction): the stream's rows say so."""
    table = ensure_table(client)
    client.execute_sql(f"UPDATE {table} SET generation = %s WHERE stream = %s", generation, stream)


def ensure_table(client: Any) -> str:
    """Create the table if missing, without a failing statement (which would abort a PostgreSQL transaction)."""
    table = client.make_qualified_table_name(TABLE)
    text, key_text, stamp = ("VARCHAR", "VARCHAR", "TIMESTAMP WITH TIME ZONE")
    if _is_mysql(client):  # key columns need a length there; its DATETIME has no zone (UTC is written)
        text, key_text, stamp = ("VARCHAR(255)", "VARCHAR(500)", "DATETIME(6)")
    create = (
        f"CREATE TABLE IF NOT EXISTS {table} (stream {text} NOT NULL, partition_key {key_text} NOT NULL, "
        f"binding {text} NOT NULL, seq BIGINT NOT NULL, generation BIGINT NOT NULL, "
        f"updated_at {stamp} NOT NULL, PRIMARY KEY (stream, partition_key))"
    )
    if is_postgres_client(client):
        # Two first loads into one schema at once (backfill workers) both pass IF NOT EXISTS and one fails on
        # pg_type's unique index: one statement that takes a transaction lock first makes the second wait.
        create = f"DO $ingest$ BEGIN PERFORM pg_advisory_xact_lock({_DDL_LOCK}); {create}; END $ingest$"
    client.execute_sql(create)
    return str(table)


def _is_mysql(client: Any) -> bool:
    return getattr(client, "dialect_name", None) in ("mysql", "mariadb")
