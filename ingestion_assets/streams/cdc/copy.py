"""Copy a CDC stream's table, or one key range of it, as of an exported snapshot, every row at one version."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

import pyarrow as pa

from ingestion_assets.loading.dead_letters import split_bad_rows
from ingestion_assets.loading.metadata_columns import with_metadata
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.sources.postgres import plan_table_read, table_slices
from ingestion_assets.sources.postgres.query import Window
from ingestion_assets.streams.cdc.history import Fences
from ingestion_assets.streams.cdc.rows import VERSION_TYPE
from ingestion_assets.streams.postgres_table import PostgresTableStream, Target
from ingestion_assets.streams.target_types import fit_plan
from ingestion_assets.sync import Faults


@dataclass(frozen=True)
class CopyRules:
    slice_rows: int
    run_id: str
    faults: Faults
    guard: bool  # another writer shares the table (history partitions): keep the newest version


def copy_as_of(
    url: str,
    stream: PostgresTableStream,
    snapshot: str,
    version: Decimal,
    rules: CopyRules,
    keys: tuple[int, int] | None = None,
    fences: Fences | None = None,
    floor: Decimal | None = None,
    loader: Loader | None = None,
) -> int:
    """The table (or its `keys` range, less the fenced keys) as of `snapshot`, every row at `version`; then
    rows left below `floor` (the whole copy's `version` by default) were deleted in the source. `loader`:
    the run's loader of the stream (bound to its target), else one of its own."""
    spec = stream.spec
    plan = plan_table_read(
        url, spec.schema_name, spec.table_name, (), tuple(spec.primary_key), destination=stream.destination.landing
    )
    if loader is None:
        loader = stream.loader(Target(stream.name, 1), None, plan, guard=rules.guard)
    plan = fit_plan(plan, loader)
    column = stream.spec.primary_key[0]
    window = Window(column, str(keys[0]), str(keys[1] + 1)) if keys is not None else None
    table_name = (stream.spec.schema_name, stream.spec.table_name)
    rows = 0
    slices = table_slices(url, plan, None, rules.slice_rows, stream.qualified_name, window=window, snapshot=snapshot)
    for piece in slices:
        source_rows = fences.drop_fenced(table_name, piece.table) if fences is not None else piece.table
        split = split_bad_rows(
            source_rows,
            stream.name,
            None,
            rules.run_id,
            stream.spec.primary_key,
            [c.name for c in plan.ordering],
            stream.spec.dead_letters.on_bad_value,
        )
        table = with_metadata(split.rows, (), dt.datetime.now(dt.UTC), 1, meta=split.meta)
        table = table.set_column(
            table.schema.get_field_index("_ingest_position"),
            "_ingest_position",
            pa.repeat(pa.scalar(version, VERSION_TYPE), table.num_rows),
        )
        loader.load(table, dead_letters=split.dead)
        rules.faults.hit("after_snapshot_slice", piece.index)
        rows += source_rows.num_rows
    soft = stream.spec.deletes == "soft"
    loader.retire_below(version if floor is None else floor, soft, (column, *keys) if keys is not None else None)
    return rows
