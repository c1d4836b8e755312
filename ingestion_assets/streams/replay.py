"""`ingest dlq replay`: read parked rows again from the source and load the ones that now fit."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from ingestion_assets.loading.dead_letters import Split, key_values, record_keys, split_bad_rows
from ingestion_assets.loading.metadata_columns import with_metadata
from ingestion_assets.loading.parked import parked_rows, release_parked
from ingestion_assets.sources.postgres import table_slices
from ingestion_assets.sources.postgres.query import ReadPlan
from ingestion_assets.streams.postgres_table import PostgresTableStream, Target
from ingestion_assets.streams.target_types import fit_plan

if TYPE_CHECKING:
    from ingestion_assets.loading.pipeline import Loader

KEYS_PER_READ = 1000


@dataclass(frozen=True)
class Replay:
    parked: int  # dead letters read again (a row, or a whole file)
    released: int  # of them, those that left the dead letters
    loaded: int  # rows loaded (a parked file's rows are many)
    still_bad: int  # rows parked again with today's error
    gone: list[str]  # keys no longer in the source: they stay parked for a person to decide


def replay_dead_letters(stream: PostgresTableStream, generation: int, run_id: str = "replay") -> Replay:
    """Rows leave the dead-letter table only once loaded; the still-bad ones are parked again, updated."""
    plan = stream.plan()
    loader = stream.loader(Target(stream.name, generation), None, plan)
    plan = fit_plan(plan, loader)
    numbers = stream.numeric_cursor(plan)

    def stamped(split: Split) -> pa.Table:
        now = dt.datetime.now(dt.UTC)
        return with_metadata(split.rows, stream.spec.cursor, now, generation, numbers=numbers)

    return read_again(stream, plan, loader, stamped, run_id)


def read_again(
    stream: PostgresTableStream,
    plan: ReadPlan,
    loader: Loader,
    stamped: Callable[[Split], pa.Table],
    run_id: str,
    release_superseded: bool = False,
) -> Replay:
    """The parked keys read again from the source with `plan`, their rows given their metadata by `stamped`, and
    loaded. `release_superseded`: a row the version guard leaves out (the target holds a newer version of its key)
    releases its dead letter too: the change it parked is older than what the target holds."""
    parked = [row["record_key"] for row in parked_rows(loader)]
    loaded = 0
    seen: set[str] = set()
    bad: set[str] = set()
    ordering = [c.name for c in plan.ordering]
    for start in range(0, len(parked), KEYS_PER_READ):
        keys = [key_values(key) for key in parked[start : start + KEYS_PER_READ]]
        for piece in table_slices(
            stream.source_url(), plan, None, stream.spec.slice_rows, stream.qualified_name, keys=keys
        ):
            seen.update(record_keys(piece.table, stream.spec.primary_key).to_pylist())
            split = split_bad_rows(
                piece.table, stream.name, None, run_id, stream.spec.primary_key, ordering, "dead_letter"
            )
            loaded += loader.load(stamped(split), dead_letters=split.dead)
            if split.dead is not None:
                bad.update(split.dead.column("record_key").to_pylist())
    if release_superseded and seen - bad:
        release_parked(loader, sorted((seen - bad) & set(parked)))
    released = len(set(parked) & seen) - len(bad)
    return Replay(len(parked), released, loaded, len(bad), sorted(set(parked) - seen))
