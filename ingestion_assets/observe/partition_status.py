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
from ingestion_assets.defs.run_tags import REFUSED

FAILED = AssetPartitionStatus.FAILED
NAMED = 5  # failed partitions named in a line; the rest are counted


@dataclass(frozen=True)
class PartitionSummary:
    total: int
    materialized: int
    failed: list[str]
    running: list[str]
    missing: int  # never run (or only planned by a run that never started it)
    never_run: tuple[str, ...] = ()  # those partitions, in order

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
    found = {**found, **_before_refused_runs(instance, key, [k for k, v in found.items() if v == FAILED])}
    by_status: dict[AssetPartitionStatus | None, list[str]] = {}
    for partition in keys:
        by_status.setdefault(found.get(partition), []).append(partition)
    return PartitionSummary(
        total=len(keys),
        materialized=len(by_status.get(AssetPartitionStatus.MATERIALIZED, [])),
        failed=by_status.get(FAILED, []),
        running=by_status.get(AssetPartitionStatus.IN_PROGRESS, []),
        missing=len(by_status.get(None, [])),
        never_run=tuple(by_status.get(None, [])),
    )


def _before_refused_runs(
    instance: dg.DagsterInstance, key: dg.AssetKey, failed: list[str]
) -> dict[str, AssetPartitionStatus | None]:
    """Failed partitions whose last attempt was a run that refused to start (a range taking in `live` unnamed):
    it read nothing, so each is as it was before, materialized or never run (Dagster counts it failed)."""
    if not failed:
        return {}
    attempts = instance.event_log_storage.get_latest_asset_partition_materialization_attempts_without_materializations(
        key
    )
    refused = {}
    for partition in failed:
        run_id = attempts.get(partition, (None, None))[0]
        run = instance.get_run_by_id(run_id) if run_id else None
        if run is not None and REFUSED in run.tags:
            refused[partition] = run
    materialized = instance.get_materialized_partitions(key) if refused else set()
    return {p: AssetPartitionStatus.MATERIALIZED if p in materialized else None for p in refused}
