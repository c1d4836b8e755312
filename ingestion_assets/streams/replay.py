"""`ingest dlq replay`: read parked rows again from the source and load the ones that now fit."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from ingestion_assets.loading.dead_letters import key_values, record_keys, split_bad_rows
from ingestion_assets.loading.metadata_columns import with_metadata
from ingestion_assets.loading.parked import parked_rows
from ingestion_assets.sources.postgres import table_slices
from ingestion_assets.streams.postgres_table import PostgresTableStream, Target
from ingestion_assets.streams.target_types import fit_plan

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
    parked = [row["record_key"] for row in parked_rows(loader)]
    loaded = still_bad = 0
    seen: set[str] = set()
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
            now = dt.datetime.now(dt.UTC)
            rows = with_metadata(split.rows, stream.spec.cursor, now, generation, numbers=stream.numeric_cursor(plan))
            loaded += loader.load(rows, dead_letters=split.dead)
            still_bad += split.dead_count
    released = len(set(parked) & seen) - still_bad
    return Replay(len(parked), released, loaded, still_bad, sorted(set(parked) - seen))
