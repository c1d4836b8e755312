"""Operator views of stream state for the CLI: checkpoints, the last run of each stream, pool sizes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg

from ingestion_assets.catalog import Catalog
from ingestion_assets.settings import Settings
from ingestion_assets.state.checkpoints import InstanceStateStore, latest_checkpoint, reset_checkpoint
from ingestion_assets.state.pools import size_pools_of


@dataclass(frozen=True)
class CheckpointRow:
    stream: str
    partition: str
    committed_at: str
    run_id: str
    position: str


@dataclass(frozen=True)
class RunLine:
    stream: str
    rows: int
    seconds: float
    rows_per_second: float
    position: str


@contextlib.contextmanager
def open_instance(settings: Settings) -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.from_config(str(settings.dagster_home)) as instance:
        yield instance


def latest_metadata(settings: Settings, source: str, stream: str) -> Mapping[str, Any]:
    """The metadata of the stream's latest materialization (empty when it has none)."""
    with open_instance(settings) as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey([source, stream]))
    return event.asset_materialization.metadata if event and event.asset_materialization else {}


def checkpoint_rows(
    settings: Settings, catalog: Catalog, selected: Sequence[tuple[str, str]] | None, partition: str | None
) -> list[CheckpointRow]:
    streams = selected or [(source, stream) for source, _, stream, _ in catalog.streams()]
    rows = []
    with open_instance(settings) as instance:
        for source, stream in streams:
            key = dg.AssetKey([source, stream])
            partitioned = _partitioned(catalog, source, stream)
            partitions = [partition] if partition or not partitioned else partitions_with_state(instance, key)
            for each in partitions or [None]:
                found = latest_checkpoint(instance, key, each)
                rows.append(
                    CheckpointRow(
                        stream=f"{source}.{stream}",
                        partition=each or "-",
                        committed_at=found.data_committed_at.isoformat(timespec="seconds") if found else "never",
                        run_id=(found.run_id or "(cli)")[:8] if found else "-",
                        position=_position_text(found.position) + _copy_text(found.details) if found else "(start)",
                    )
                )
    return rows


def _partitioned(catalog: Catalog, source: str, stream: str) -> bool:
    """The stream's own partitions, or a CDC source's history partitions (`live` and the key ranges)."""
    found = catalog.sources[source]
    cdc = getattr(found, "cdc", None)
    history = getattr(found, "mode", None) == "cdc" and cdc is not None and cdc.history_chunk is not None
    return history or found.streams[stream].partitions is not None


def partitions_with_state(instance: dg.DagsterInstance, key: dg.AssetKey) -> list[str | None]:
    """The partitions that ever stored a checkpoint, in the order they first did."""
    seen: dict[str, None] = {}
    cursor = None
    while True:
        result = instance.fetch_observations(key, limit=1000, cursor=cursor, ascending=True)
        for record in result.records:
            if record.partition_key is not None:
                seen.setdefault(record.partition_key, None)
        if not result.has_more:
            return list(seen)
        cursor = result.cursor


def latest_runs(settings: Settings, catalog: Catalog) -> list[RunLine]:
    lines = []
    with open_instance(settings) as instance:
        for source, _, stream, _ in catalog.streams():
            key = dg.AssetKey([source, stream])
            result = instance.fetch_materializations(key, limit=1)
            metadata: dict[str, Any] = {}
            if result.records and result.records[0].asset_materialization is not None:
                metadata = {k: v.value for k, v in result.records[0].asset_materialization.metadata.items()}
            checkpoint = latest_checkpoint(instance, key)
            rows, seconds = int(metadata.get("rows read", 0) or 0), float(metadata.get("seconds", 0.0) or 0.0)
            rate = metadata.get("rows per second") or (rows / seconds if seconds > 0 else 0.0)  # CDC runs give no rate
            lines.append(
                RunLine(
                    stream=f"{source}.{stream}",
                    rows=rows,
                    seconds=seconds,
                    rows_per_second=float(rate),
                    position=_position_text(checkpoint.position) if checkpoint else "(none)",
                )
            )
    return lines


def reset_stream(settings: Settings, source: str, stream: str, partition: str | None) -> None:
    with open_instance(settings) as instance:
        reset_checkpoint(instance, dg.AssetKey([source, stream]), partition, reason="ingest state reset")


def request_refresh(settings: Settings, source: str, stream: str, mode: str) -> None:
    """Mark the stream: its next run re-reads everything as a new generation (`remove` swaps it in whole,
    `retain` merges it over the target)."""
    with open_instance(settings) as instance:
        store = InstanceStateStore(instance, dg.AssetKey([source, stream]))
        latest = store.latest(None)
        details = dict(latest.details) if latest else {}
        kept = {k: details[k] for k in ("generation", "complete") if k in details}
        store.commit(None, latest.position if latest else None, **kept, refresh_requested=mode)


def size_pools(settings: Settings, catalog: Catalog) -> None:
    """Each source's pool gets the catalog's max_concurrency slots, so a backfill cannot flood it."""
    with open_instance(settings) as instance:
        size_pools_of(instance, catalog)


def _copy_text(details: dict[str, Any]) -> str:
    """A CDC stream whose copy is under way holds a log position but not yet all its rows: say so."""
    copy = details.get("copy")
    if not isinstance(copy, dict):
        return ""
    return f"  copy under way: {copy.get('ranges', 0)} range(s), {copy.get('rows', 0):,} row(s) copied so far"


def _position_text(position: dict[str, object] | None) -> str:
    return "(start)" if position is None else json.dumps(position, default=str)
