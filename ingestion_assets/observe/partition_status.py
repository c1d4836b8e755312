"""Where a partitioned stream's partitions stand: materialized, failed, running, or never run.

A backfill is many runs, one per chunk: the stream's latest materialization says nothing of the chunk that
failed before it, nor of the chunks never launched. Dagster keeps each partition's latest outcome."""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg
from dagster._core.storage.partition_status_cache import AssetPartitionStatus

from ingestion_assets.catalog import AnyStream, FilesStream, PostgresSource, PostgresStream
from ingestion_assets.defs.cdc import history_partitions
from ingestion_assets.defs.partitions import partitions_def

NAMED = 5  # failed partitions named in a line; the rest are counted


@dataclass(frozen=True)
class PartitionSummary:
    total: int
    materialized: int
    failed: list[str]
    running: list[str]
    missing: int  # never run (or only planned by a run that never started it)

    def failed_text(self) -> str:
        """`partition 2026-01-02 failed`, `partitions a, b, c, d, e failed (and 3 more)`."""
        return f"partition{'s' if len(self.failed) > 1 else ''} {named(self.failed)} failed"


def named(partitions: list[str]) -> str:
    """The first few partitions by name, the rest counted: a status line stays one line."""
    more = f" (and {len(partitions) - NAMED} more)" if len(partitions) > NAMED else ""
    return ", ".join(partitions[:NAMED]) + more


def stream_partitions(
    source_name: str, source: object, stream_name: str, spec: AnyStream
) -> dg.PartitionsDefinition | None:
    """The stream's Dagster partitions: a CDC source's history chunks, or a table or files stream's own."""
    if isinstance(source, PostgresSource) and source.mode == "cdc":
        return history_partitions(source_name, source)
    if isinstance(spec, PostgresStream | FilesStream) and spec.partitions is not None:
        return partitions_def(source_name, stream_name, spec)
    return None


def partition_summary(
    instance: dg.DagsterInstance, key: dg.AssetKey, partitions: dg.PartitionsDefinition
) -> PartitionSummary:
    keys = list(partitions.get_partition_keys(dynamic_partitions_store=instance))
    found = (instance.get_status_by_partition(key, keys, partitions) or {}) if keys else {}
    by_status: dict[AssetPartitionStatus | None, list[str]] = {}
    for partition in keys:
        by_status.setdefault(found.get(partition), []).append(partition)
    return PartitionSummary(
        total=len(keys),
        materialized=len(by_status.get(AssetPartitionStatus.MATERIALIZED, [])),
        failed=by_status.get(AssetPartitionStatus.FAILED, []),
        running=by_status.get(AssetPartitionStatus.IN_PROGRESS, []),
        missing=len(by_status.get(None, [])),
    )
