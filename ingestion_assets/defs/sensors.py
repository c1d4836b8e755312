"""Sensors: plan new key-range partitions as a key-partitioned source table grows."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg

from ingestion_assets.catalog import KeyPartitions, PostgresStream
from ingestion_assets.defs.partitions import plan_key_partitions
from ingestion_assets.defs.streams import StreamRef, is_table, open_stream

if TYPE_CHECKING:
    from ingestion_assets.streams.runner import Stream


def build_sensors(streams: list[StreamRef] | list[Stream]) -> list[dg.SensorDefinition]:
    return [_key_range_planner(s) for s in streams if is_table(s) and isinstance(s.spec.partitions, KeyPartitions)]


def _key_range_planner(stream: StreamRef | Stream) -> dg.SensorDefinition:
    spec = stream.spec
    assert isinstance(spec, PostgresStream)

    @dg.sensor(
        name=f"{stream.source_name}__{stream.name}__plan_key_ranges",
        minimum_interval_seconds=300,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"adds key-range partitions as {spec.table} grows (and the `live` tail once)",
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        from ingestion_assets.streams.postgres_table import PostgresTableStream  # the source's reader: ticks only

        table = open_stream(stream)
        assert isinstance(table, PostgresTableStream)
        added = plan_key_partitions(table, context.instance)
        return dg.SkipReason(f"added partitions {added}" if added else "no new key ranges")

    return _sensor
