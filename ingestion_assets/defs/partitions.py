"""Dagster partitions for streams: time windows, or key ranges (dynamic, planned from the source)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING

import dagster as dg

from ingestion_assets.catalog import (
    FilesStream,
    KeyPartitions,
    PathKeyPartitions,
    PathTimePartitions,
    PostgresStream,
    TimePartitions,
)
from ingestion_assets.defs.run_tags import mark_refused
from ingestion_assets.partitions import KEY_FORMATS, LIVE, key_range, key_range_keys, key_ranges_below
from ingestion_assets.state.checkpoints import InstanceStateStore, latest_checkpoint

if TYPE_CHECKING:
    from ingestion_assets.streams.files import FileSourceStream
    from ingestion_assets.streams.postgres_table import PostgresTableStream

_TIME_DEFS = {
    "hourly": dg.HourlyPartitionsDefinition,
    "daily": dg.DailyPartitionsDefinition,
    "weekly": dg.WeeklyPartitionsDefinition,
    "monthly": dg.MonthlyPartitionsDefinition,
}


def dynamic_partitions_name(source_name: str, stream_name: str) -> str:
    return f"{source_name}__{stream_name}__keys"


def partitions_def(
    source_name: str, stream_name: str, spec: PostgresStream | FilesStream
) -> dg.PartitionsDefinition | None:
    partitions = spec.partitions
    if isinstance(partitions, TimePartitions | PathTimePartitions):
        start = dt.datetime.combine(partitions.start, dt.time(), tzinfo=dt.UTC)
        # end_offset=1: the current, still-filling window is a partition too: it is the live one
        return _TIME_DEFS[partitions.granularity](
            start_date=start.strftime(KEY_FORMATS[partitions.granularity]), timezone="UTC", end_offset=1
        )
    if isinstance(partitions, KeyPartitions | PathKeyPartitions):
        return dg.DynamicPartitionsDefinition(name=dynamic_partitions_name(source_name, stream_name))
    return None


def range_partitions(context: dg.AssetExecutionContext) -> list[str]:
    """The partitions of a range run, in order; a range that takes in `live` without naming it is refused.

    Key ranges planned after `live` come after it in the partition list (a dynamic partition set keeps the order
    keys were added in), so `--partition-range FIRST...LAST` over key ranges could take in the live tail. One
    materialization stands for every partition of the range, so `live` cannot simply be left out: it would be
    recorded as materialized without being read. The run fails at once saying which ranges to run instead."""
    keys = list(context.partition_keys)
    bounds = context.partition_key_range
    if LIVE not in keys or LIVE in (bounds.start, bounds.end):
        return keys
    at = keys.index(LIVE)
    why = (
        f"the partition range {bounds.start}...{bounds.end} takes in `{LIVE}` (key ranges planned after it come "
        f"after it in the partition list), which a range names only as its first or last partition: run "
        f"{bounds.start}...{keys[at - 1]} and {keys[at + 1]}...{bounds.end}, and `{LIVE}` by itself; nothing "
        "was read"
    )
    mark_refused(context, why)
    raise dg.Failure(description=why, allow_retries=False)


def newest_partition(spec: PostgresStream | FilesStream, partitions: dg.PartitionsDefinition) -> str | None:
    """What a schedule keeps syncing: the `live` key partition, or the current time window (key ranges of
    file paths have no newest one: their runs are backfills)."""
    if isinstance(spec.partitions, KeyPartitions):
        return LIVE if spec.partitions.live else None
    if isinstance(spec.partitions, PathKeyPartitions):
        return None
    keys = partitions.get_partition_keys()
    return keys[-1] if keys else None


def plan_key_partitions(stream: PostgresTableStream, instance: dg.DagsterInstance) -> list[str]:
    """Add the key ranges the source's table now needs (and `live`); returns the keys added.

    The first time, the live tail's checkpoint is set to the table's newest position once it is settled
    (no transaction open now can still commit behind it): every change after it reaches `live`, every row
    before it belongs to a range, so none falls between.
    """
    from ingestion_assets.sources.postgres import key_bounds  # the source's reader: at planning time only
    from ingestion_assets.streams.late_commits import PROBES, settled_now

    spec = stream.spec
    assert isinstance(spec.partitions, KeyPartitions)
    name = dynamic_partitions_name(stream.source_name, stream.name)
    existing = instance.get_dynamic_partitions(name)
    plan = stream.plan()
    column = spec.partition_column
    assert column is not None
    bounds = key_bounds(stream.source_url(), plan, column)
    added = _new_ranges(existing, bounds, spec.partitions.chunk)
    if spec.partitions.live and LIVE not in existing:
        key = dg.AssetKey([stream.source_name, stream.name])
        if latest_checkpoint(instance, key, LIVE) is None:
            start, probes = settled_now(stream.source_url(), plan, spec)
            InstanceStateStore(instance, key).commit(
                LIVE, start, complete=True, planned=True, generation=1, **{PROBES: probes}
            )
        added.append(LIVE)
    if added:
        instance.add_dynamic_partitions(name, added)
    return added


def _new_ranges(existing: Sequence[str], bounds: tuple[int, int] | None, chunk: int) -> list[str]:
    """Ranges for keys in `bounds` no existing range covers: existing ones stay, new ones continue them."""
    ranges = [k for k in existing if k != LIVE]
    if bounds is None:
        return []
    added: list[str] = []
    highest = max(key_range(k)[1] for k in ranges) if ranges else None
    lowest = min(key_range(k)[0] for k in ranges) if ranges else None
    if lowest is not None and bounds[0] < lowest:
        added += key_ranges_below(bounds[0], lowest, chunk)
    return added + key_range_keys(bounds[0], bounds[1], chunk, after=highest)


def plan_file_key_partitions(stream: FileSourceStream, instance: dg.DagsterInstance) -> list[str]:
    """Add the key ranges the numbers in the stream's file paths now need; returns the keys added."""
    from ingestion_assets.streams.files import relative_path  # the files' reader: at planning time only
    from ingestion_assets.streams.files_partitions import path_numbers

    partitions = stream.spec.partitions
    assert isinstance(partitions, PathKeyPartitions)
    name = dynamic_partitions_name(stream.source_name, stream.name)
    _, root = stream.filesystem()
    numbers = path_numbers(stream.spec, [relative_path(f.path, root) for f in stream.files()])
    bounds = (min(numbers), max(numbers)) if numbers else None
    added = _new_ranges(instance.get_dynamic_partitions(name), bounds, partitions.chunk)
    if added:
        instance.add_dynamic_partitions(name, added)
    return added
