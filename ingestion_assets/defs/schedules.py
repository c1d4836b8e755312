"""Schedules from the catalog: each source's cron runs its job (partitioned streams: the newest partition)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg

from ingestion_assets.catalog import FilesStream, PathKeyPartitions, PostgresStream
from ingestion_assets.defs.jobs import Jobs, job_name
from ingestion_assets.defs.partitions import newest_partition, partitions_def
from ingestion_assets.defs.streams import StreamRef

if TYPE_CHECKING:
    from ingestion_assets.streams.runner import Stream


def build_schedules(streams: list[StreamRef] | list[Stream], jobs: Jobs) -> list[dg.ScheduleDefinition]:
    """Every schedule targets a named job (defs/jobs.py), so the runs it starts carry the source's name."""
    schedules: list[dg.ScheduleDefinition] = []
    by_source: dict[str, list[StreamRef | Stream]] = {}
    for stream in streams:
        if stream.source.schedule:
            by_source.setdefault(stream.source_name, []).append(stream)
    for source_name, members in by_source.items():
        cron = members[0].source.schedule
        assert cron is not None
        plain = [s for s in members if not _partitioned(s)]
        if plain:
            schedules.append(
                dg.ScheduleDefinition(
                    name=f"{source_name}__sync",
                    cron_schedule=cron,
                    target=jobs[job_name(source_name)],
                    default_status=dg.DefaultScheduleStatus.RUNNING,
                    execution_timezone="UTC",
                )
            )
        for stream in members:
            if _partitioned(stream):
                if isinstance(stream.spec, FilesStream) and isinstance(stream.spec.partitions, PathKeyPartitions):
                    continue  # ranges of path numbers have no newest one: they are backfilled
                schedules.append(_newest_partition_schedule(stream, cron, jobs))
    return schedules


def _partitioned(stream: StreamRef | Stream) -> bool:
    return isinstance(stream.spec, PostgresStream | FilesStream) and stream.spec.partitions is not None


def _newest_partition_schedule(stream: StreamRef | Stream, cron: str, jobs: Jobs) -> dg.ScheduleDefinition:
    spec = stream.spec
    assert isinstance(spec, PostgresStream | FilesStream)
    partitions = partitions_def(stream.source_name, stream.name, spec)
    assert partitions is not None

    @dg.schedule(
        name=f"{stream.source_name}__{stream.name}__newest",
        cron_schedule=cron,
        target=jobs[job_name(stream.source_name, stream.name)],
        default_status=dg.DefaultScheduleStatus.RUNNING,
        execution_timezone="UTC",
    )
    def _schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        if isinstance(partitions, dg.DynamicPartitionsDefinition):
            keys = context.instance.get_dynamic_partitions(partitions.name or "")
            if not keys:
                return dg.SkipReason("no key ranges planned yet: the planning sensor adds them")
        partition = newest_partition(spec, partitions)
        if partition is None:
            return dg.SkipReason("no partition to sync")
        return dg.RunRequest(partition_key=partition)

    return _schedule
