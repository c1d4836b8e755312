"""Sensors: plan new key-range partitions as a key-partitioned source table grows."""

from __future__ import annotations

import dagster as dg

from ingestion_assets.catalog import KeyPartitions, PathKeyPartitions
from ingestion_assets.defs.partitions import plan_file_key_partitions, plan_key_partitions
from ingestion_assets.streams.files import FileSourceStream
from ingestion_assets.streams.postgres_table import PostgresTableStream
from ingestion_assets.streams.runner import Stream


def build_sensors(streams: list[Stream]) -> list[dg.SensorDefinition]:
    return [
        _key_range_planner(s)
        for s in streams
        if (isinstance(s, PostgresTableStream) and isinstance(s.spec.partitions, KeyPartitions))
        or (isinstance(s, FileSourceStream) and isinstance(s.spec.partitions, PathKeyPartitions))
    ]


def _key_range_planner(stream: PostgresTableStream | FileSourceStream) -> dg.SensorDefinition:
    what = stream.spec.table if isinstance(stream, PostgresTableStream) else f"the files {stream.spec.path}"

    @dg.sensor(
        name=f"{stream.source_name}__{stream.name}__plan_key_ranges",
        minimum_interval_seconds=300,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"adds key-range partitions as {what} grows (and the `live` tail once)",
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        if isinstance(stream, FileSourceStream):
            added = plan_file_key_partitions(stream, context.instance)
        else:
            added = plan_key_partitions(stream, context.instance)
        return dg.SkipReason(f"added partitions {added}" if added else "no new key ranges")

    return _sensor
