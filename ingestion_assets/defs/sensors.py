"""Sensors from the catalog: planners that add key-range partitions as a table (or a files drop) grows."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg

from ingestion_assets.catalog import FilesStream, KeyPartitions, PathKeyPartitions, PostgresStream
from ingestion_assets.defs.partitions import plan_file_key_partitions, plan_key_partitions
from ingestion_assets.defs.streams import StreamRef, open_stream

if TYPE_CHECKING:
    from ingestion_assets.streams.runner import Stream


def build_sensors(streams: list[StreamRef] | list[Stream]) -> list[dg.SensorDefinition]:
    return [_key_range_planner(s) for s in streams if _planned(s)]


def _planned(stream: StreamRef | Stream) -> bool:
    spec = stream.spec
    return (isinstance(spec, PostgresStream) and isinstance(spec.partitions, KeyPartitions)) or (
        isinstance(spec, FilesStream) and isinstance(spec.partitions, PathKeyPartitions)
    )


def _key_range_planner(stream: StreamRef | Stream) -> dg.SensorDefinition:
    spec = stream.spec
    what = spec.table if isinstance(spec, PostgresStream) else f"the files {getattr(spec, 'path', '?')}"

    @dg.sensor(
        name=f"{stream.source_name}__{stream.name}__plan_key_ranges",
        minimum_interval_seconds=300,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"adds key-range partitions as {what} grows (and the `live` tail once)",
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        from ingestion_assets.streams.files import FileSourceStream  # the source's reader: ticks only
        from ingestion_assets.streams.postgres_table import PostgresTableStream

        running = open_stream(stream)
        if isinstance(running, FileSourceStream):
            added = plan_file_key_partitions(running, context.instance)
        else:
            assert isinstance(running, PostgresTableStream)
            added = plan_key_partitions(running, context.instance)
        return dg.SkipReason(f"added partitions {added}" if added else "no new key ranges")

    return _sensor
