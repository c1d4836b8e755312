"""Before a storage restore takes over: are the restored checkpoints at or behind what the target holds,
and can each CDC source's slot still deliver the changes after them?

A checkpoint older than the target only replays (the merge absorbs it); one newer than the target would
make the next run skip the rows between the two. The target's `_ingest_bindings` rows (binding, slices
committed) and the checkpoints' `target` detail (same binding, slices counted) say which is which.
A CDC checkpoint taken back is older than the slot's acknowledged position: the slot no longer holds the
changes in between, so the next run meets a WAL gap (and follows the source's `on_wal_gap`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import dagster as dg
import duckdb
import psycopg2

from ingestion_assets.catalog import Catalog, PostgresSource
from ingestion_assets.loading.bindings import TABLE, Marker
from ingestion_assets.loading.destinations import connect_postgres, duckdb_path
from ingestion_assets.settings import Settings
from ingestion_assets.state.checkpoints import latest_checkpoint
from ingestion_assets.state.summary import partitions_with_state
from ingestion_assets.streams.target_binding import TARGET


def checkpoints_ahead_of_target(settings: Settings, catalog: Catalog, instance: dg.DagsterInstance) -> list[str]:
    """One line per stream partition whose checkpoint in `instance` claims more than the target holds."""
    problems: list[str] = []
    for source_name, _, stream_name, _ in catalog.streams():
        markers = target_markers(settings, catalog, source_name, stream_name)
        key = dg.AssetKey([source_name, stream_name])
        for partition in _partitions(instance, key, markers):
            checkpoint = latest_checkpoint(instance, key, partition)
            stored = checkpoint.details.get(TARGET) if checkpoint and checkpoint.position is not None else None
            if isinstance(stored, dict) and "seq" in stored:
                problem = _ahead(stored, markers.get(partition))
                if problem:
                    where = f"{source_name}.{stream_name}" + (f" partition {partition}" if partition else "")
                    problems.append(f"{where}: {problem}")
    return problems


def _partitions(instance: dg.DagsterInstance, key: dg.AssetKey, markers: dict[str | None, Marker]) -> list[str | None]:
    """Each partition the stream holds a checkpoint or a target record of; [None] for an unpartitioned stream.
    A partitioned stream (key ranges, time windows, CDC history) has no checkpoint of its own: the newest
    checkpoint of any of its partitions is not one, and its target holds no unpartitioned record to match."""
    held = {*partitions_with_state(instance, key), *instance.get_materialized_partitions(key), *markers} - {None}
    return sorted(held, key=str) if held else [None]


def _ahead(stored: dict[str, Any], marker: Marker | None) -> str | None:
    seq = int(stored["seq"])
    if marker is None:
        return f"the restored checkpoint counts {seq} committed slices; the target holds none of this stream"
    if marker.binding != str(stored.get("binding")):
        return "the restored checkpoint describes another copy of the stream than the target holds"
    if seq > marker.seq:
        return f"the restored checkpoint counts {seq} committed slices, the target holds {marker.seq}"
    return None


def target_markers(settings: Settings, catalog: Catalog, source_name: str, stream: str) -> dict[str | None, Marker]:
    """The target's record of the stream, per partition (None: unpartitioned); empty if it has none."""
    statement = f'SELECT partition_key, binding, seq, generation FROM "{source_name}".{TABLE} WHERE stream = %s'
    destination = catalog.destination
    rows: list[tuple[Any, ...]] = []
    if destination.type == "duckdb":
        path = duckdb_path(settings, destination)
        if not path.exists():
            return {}
        with (
            contextlib.closing(duckdb.connect(str(path), read_only=True)) as con,
            contextlib.suppress(duckdb.CatalogException),
        ):
            rows = con.execute(statement.replace("%s", "?"), [stream]).fetchall()
    else:
        with (
            contextlib.closing(connect_postgres(settings, destination)) as conn,
            conn.cursor() as cur,
            contextlib.suppress(psycopg2.errors.UndefinedTable),
        ):
            cur.execute(statement, (stream,))
            rows = cur.fetchall()
    return {(row[0] or None): Marker(str(row[1]), int(row[2]), int(row[3])) for row in rows}


def cdc_slots_past_checkpoints(settings: Settings, catalog: Catalog, instance: dg.DagsterInstance) -> list[str]:
    """One line per CDC source whose slot was acknowledged past a restored checkpoint (or is gone): what the
    restore loses and what the next run does about it."""
    from ingestion_assets.defs.cdc import DagsterCdcStore
    from ingestion_assets.defs.sources import slot_name
    from ingestion_assets.partitions import LIVE
    from ingestion_assets.references import postgres_url
    from ingestion_assets.sources.postgres.cdc import find_gap
    from ingestion_assets.streams.cdc.state import SourceState

    lines = []
    for name, source in catalog.sources.items():
        if not isinstance(source, PostgresSource) or source.mode != "cdc":
            continue
        keys = {stream: dg.AssetKey([name, stream]) for stream in source.streams}
        partition = LIVE if source.cdc.history_chunk is not None else None
        state = SourceState(DagsterCdcStore(instance, keys, partition=partition).latest())
        if not state.started:
            continue
        slot = slot_name(name, source)
        try:
            gap = find_gap(
                postgres_url(source.connection, source.tls, settings, f"sources.{name}.connection"), slot, state.low
            )
        except (psycopg2.Error, OSError, ValueError) as exc:  # the source is down or unreachable from here
            lines.append(f"source {name}: could not check its slot {slot} against the restored checkpoints: {exc}")
            continue
        if gap is not None:
            resync = source.cdc.on_wal_gap == "resync" and source.cdc.history_chunk is None
            then = (
                "its next run drops the slot and copies every stream again (on_wal_gap: resync)"
                if resync
                else "its next run stops with the commands that copy the streams again (on_wal_gap: fail)"
            )
            lines.append(f"source {name}, slot {slot}: the restored checkpoints are behind the slot: {gap}; {then}")
    return lines
