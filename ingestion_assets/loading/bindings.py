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

from dlt.destinations.exceptions import DatabaseUndefinedRelation

TABLE = "_ingest_bindings"
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
    except DatabaseUndefinedRelation:
        return None
    if not rows:
        return None
    binding, seq, generation = rows[0]
    return Marker(str(binding), int(seq), int(generation))


def write_marker(client: Any, stream: str, partition: str | None, marker: Marker) -> None:
    """Upsert the stream partition's row (the dataset exists: a load just went into it)."""
    table = ensure_table(client)
    client.execute_sql(
        f"INSERT INTO {table} ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (stream, partition_key) "
        "DO UPDATE SET binding = excluded.binding, seq = excluded.seq, generation = excluded.generation, "
        "updated_at = excluded.updated_at",
        stream,
        partition or "",
        marker.binding,
        marker.seq,
        marker.generation,
        dt.datetime.now(dt.UTC),
    )


def set_generation(client: Any, stream: str, generation: int) -> None:
    """A refresh swapped a new generation in (call inside the swap's transaction): the stream's rows say so."""
    table = ensure_table(client)
    client.execute_sql(f"UPDATE {table} SET generation = %s WHERE stream = %s", generation, stream)


def ensure_table(client: Any) -> str:
    """Create the table if missing, without a failing statement (which would abort a PostgreSQL transaction)."""
    table = client.make_qualified_table_name(TABLE)
    client.execute_sql(
        f"CREATE TABLE IF NOT EXISTS {table} (stream VARCHAR NOT NULL, partition_key VARCHAR NOT NULL, "
        "binding VARCHAR NOT NULL, seq BIGINT NOT NULL, generation BIGINT NOT NULL, "
        "updated_at TIMESTAMP WITH TIME ZONE NOT NULL, PRIMARY KEY (stream, partition_key))"
    )
    return str(table)
