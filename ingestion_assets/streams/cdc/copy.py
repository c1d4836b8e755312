"""Copy a CDC stream's table as of an exported snapshot, every row at one version: one history key range
(`copy_as_of`), or the next range of a resumable copy in primary-key order (`copy_range`)."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Generator
from dataclasses import dataclass
from decimal import Decimal
from typing import cast

import pyarrow as pa

from ingestion_assets.loading.dead_letters import split_bad_rows
from ingestion_assets.loading.metadata_columns import with_metadata
from ingestion_assets.loading.naming import NameCollision
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.sources.postgres import plan_table_read, table_slices
from ingestion_assets.sources.postgres.introspect import TableShape
from ingestion_assets.sources.postgres.query import Position, ReadPlan, Window
from ingestion_assets.sources.slices import Slice
from ingestion_assets.streams.cdc.history import Fences
from ingestion_assets.streams.cdc.outcome import ColumnsUnlandable
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


@dataclass(frozen=True)
class RangeCopied:
    """One range of a resumable copy: the rows it read, its last key, whether it was the last range, and how many
    of its rows were parked (the run counts them with the log's)."""

    rows: int
    last: Position | None
    done: bool
    parked: int = 0


def copy_as_of(
    url: str,
    stream: PostgresTableStream,
    snapshot: str,
    version: Decimal,
    rules: CopyRules,
    keys: tuple[int, int],
    fences: Fences,
    floor: Decimal,
) -> RangeCopied:
    """The `keys` range (an integer key, a history chunk), less the fenced keys, as of `snapshot`, every row
    at `version`; then rows of the range left below `floor` were deleted in the source. Returns the rows read and
    parked (no last key: a history range is copied whole)."""
    loader, plan = _reader(url, stream, rules, None)
    column = stream.spec.primary_key[0]
    window = Window(column, str(keys[0]), str(keys[1] + 1))
    rows = parked = 0
    slices = table_slices(url, plan, None, rules.slice_rows, stream.qualified_name, window=window, snapshot=snapshot)
    for piece in slices:
        read, dead = _load_slice(stream, plan, loader, piece, version, rules, fences)
        rows, parked = rows + read, parked + dead
        rules.faults.hit("after_snapshot_slice", piece.index)
    loader.retire_below(floor, stream.spec.deletes == "soft", (column, *keys))
    return RangeCopied(rows, None, True, parked)


def copy_range(
    url: str,
    stream: PostgresTableStream,
    snapshot: str,
    version: Decimal,
    rules: CopyRules,
    after: Position | None,
    fences: Fences,
    loader: Loader,
    index: int,
) -> RangeCopied:
    """The rows after key `after` (None: from the first) in primary-key order, one slice of them, as of
    `snapshot` less the fenced keys, every row at `version`. Keyset order on the whole primary key, so any
    orderable key works. Only a range that finds no row ends the copy: a reader may give a slice shorter than
    `slice_rows` before the end, and taking it for the last range would leave the keys after it uncopied (and
    retired as deleted).
    `index`: the range's number in its copy (the fault point's slice)."""
    _, plan = _reader(url, stream, rules, loader)
    slices = table_slices(
        url, plan, after, rules.slice_rows, stream.qualified_name, snapshot=snapshot, limit=rules.slice_rows
    )
    # The rest of the table is the next range's, under its own snapshot: the read ends after one slice.
    with contextlib.closing(cast(Generator[Slice, None, None], slices)):
        piece = next(slices, None)
    if piece is None:
        return RangeCopied(0, after, True)
    rows, parked = _load_slice(stream, plan, loader, piece, version, rules, fences)
    rules.faults.hit("after_snapshot_slice", index)
    return RangeCopied(rows, piece.position, False, parked)


def _reader(url: str, stream: PostgresTableStream, rules: CopyRules, loader: Loader | None) -> tuple[Loader, ReadPlan]:
    """The table's read plan in primary-key order, fitted to the target; `loader`: the run's loader of the
    stream (bound to its target), else one of its own."""
    plan = table_plan(url, stream)
    if loader is None:
        loader = stream.loader(Target(stream.name, 1), None, plan, guard=rules.guard)
    return loader, fitted_plan(stream, plan, loader)


def table_plan(url: str, stream: PostgresTableStream) -> ReadPlan:
    """How a CDC stream reads its table's rows (a copy, a replay of dead letters): no cursor, by primary key, a
    value over the stream's `max_value_bytes` parked as a table stream parks it (the copy read it with the default
    limit: a value the user had set a smaller limit for landed all the same)."""
    spec = stream.spec
    return plan_table_read(
        url,
        spec.schema_name,
        spec.table_name,
        (),
        tuple(spec.primary_key),
        max_value_bytes=spec.dead_letters.max_value_bytes,
        destination=stream.destination.landing,
    )


def fitted_plan(stream: PostgresTableStream, plan: ReadPlan, loader: Loader) -> ReadPlan:
    """`plan` fitted to the target, once its columns are known to land under their names."""
    spec = stream.spec
    where = f"stream {stream.qualified_name} (table {spec.schema_name}.{spec.table_name})"
    try:  # the run's checks saw the table before this range: a column added since is seen here first
        loader.names.check(where, plan.shape.column_names, views=False)
    except NameCollision as exc:
        raise ColumnsUnlandable(
            f"{exc}. The column came while its copy ran: nothing of this range was loaded, and the next attempt "
            "leaves this stream out while the other streams of the source go on",
            str(exc),
        ) from exc
    return fit_plan(plan, loader)


def _load_slice(
    stream: PostgresTableStream,
    plan: ReadPlan,
    loader: Loader,
    piece: Slice,
    version: Decimal,
    rules: CopyRules,
    fences: Fences,
) -> tuple[int, int]:
    """One slice less its fenced keys, bad rows parked, every row at `version`; returns the rows read and parked
    (the run's count of dead letters left out the copy's: its metadata and check said none were parked)."""
    source_rows = fences.drop_fenced((stream.spec.schema_name, stream.spec.table_name), piece.table, plan.shape)
    split = split_bad_rows(
        source_rows,
        stream.name,
        None,
        rules.run_id,
        stream.spec.primary_key,
        [c.name for c in plan.ordering],
        stream.spec.dead_letters.on_bad_value,
    )
    loader.load(at_version(split.rows, version, split.meta), dead_letters=split.dead)
    return source_rows.num_rows, split.dead_count + loader.take_parked()


def create_target(loader: Loader, shape: TableShape) -> None:
    """The stream's target table, empty, if it is missing: a copy's first log batch may come before its
    first range (a delete of a row not copied yet carries the key alone)."""
    schema = pa.schema([field.with_nullable(True) for field in shape.arrow_schema])  # as the log's rows load
    loader.create_if_missing(at_version(schema.empty_table(), Decimal(0)))


def at_version(rows: pa.Table, version: Decimal, meta: pa.Array | None = None) -> pa.Table:
    """The rows with the metadata columns, every one at `version` (a log position, see rows.py)."""
    table = with_metadata(rows, (), dt.datetime.now(dt.UTC), 1, meta=meta)
    return table.set_column(
        table.schema.get_field_index("_ingest_position"),
        "_ingest_position",
        pa.repeat(pa.scalar(version, VERSION_TYPE), table.num_rows),
    )
