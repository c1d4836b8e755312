"""What a reconciliation found: the figures the `reconciliation` asset check shows, and sample keys."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.loading.dead_letters import record_keys
from ingestion_assets.streams.reconcile.diff import DELETED, DUPLICATE, MISSING, NEWER, STALE, UNSYNCED
from ingestion_assets.streams.reconcile.relation import key_alias

SAMPLE = 10


@dataclass(frozen=True)
class Reconciliation:
    scope: str  # window | full
    deletes: str = "report"  # what was done with rows only in the target: report | hard | soft
    source_rows: int = 0  # rows compared: with a key (no NULL in a key column)
    target_rows: int = 0  # live rows with a key
    null_keys: int = 0  # source rows with a NULL in a key column: not comparable, the load parks them as dead letters
    null_keys_in_target: int = 0  # live target rows with a NULL key (loaded before such rows were parked): not compared
    buckets: int = 0  # buckets holding rows on either side
    buckets_differing: int = 0
    keys_diffed: int = 0  # rows fetched key by key, both sides
    missing: int = 0  # source rows at or before the checkpoint the target lacks (not parked)
    stale: int = 0  # the target holds an older version than the source's, at or before the checkpoint
    newer_in_target: int = 0  # the target holds a newer version: the source's cursor went backwards
    deleted_at_source: int = 0  # only in the target: hard deletes, primary-key changes, truncates
    deletions_applied: int = 0
    not_yet_synced: int = 0  # the source's version is past the checkpoint: the next run reads it
    parked: int = 0  # source rows that differ because they wait in the dead-letter table
    repeated_at_source: int = 0  # older rows of a key the source holds several times (the target keeps the newest)
    repaired: int = 0  # missing or older rows read again by key in the same run, and found in place after
    replaced_newer: int = 0  # of `repaired`: rows newer in the target that `--source-wins` replaced by the source's
    owed: str | None = None  # a gap found and not repaired (this run or before): later runs compare the whole table
    samples: dict[str, list[str]] = field(default_factory=dict)
    skipped: str | None = None  # why nothing was compared
    error: str | None = None  # the comparison could not finish (the run's load is committed all the same)
    seconds: float = 0.0
    whole_because: str | None = None  # why a run compared its whole table or partition, not its window
    # the keys (k0.., typed as the source's) of the missing and older rows, for the repair; not shown
    found_keys: pa.Table | None = field(default=None, repr=False, compare=False)
    # the keys (as found_keys) of the rows newer in the target: loaded over only when asked (`--source-wins`)
    newer_keys: pa.Table | None = field(default=None, repr=False, compare=False)

    @property
    def passed(self) -> bool:
        """Nothing unexplained: every row the checkpoint covers is in the target at the source's version."""
        unexplained = self.missing or self.stale or self.newer_in_target
        return self.error is None and not unexplained and self.owed is None

    @property
    def deletes_pending(self) -> int:
        return self.deleted_at_source - self.deletions_applied


@dataclass(frozen=True)
class Found:
    """The diff's classified rows, split into counts, samples and the keys to delete."""

    counts: dict[str, int]
    samples: dict[str, list[str]]
    parked: int
    deleted_keys: pa.Table  # target-typed key columns k0.. of the rows only in the target
    repairable: pa.Table  # source-typed key columns k0.. of the missing and older rows (not parked)
    newer: pa.Table  # source-typed key columns k0.. of the rows newer in the target


def summarize(classified: pa.Table, keys: int, parked: set[str]) -> Found:
    counts: dict[str, int] = {}
    samples: dict[str, list[str]] = {}
    parked_count = 0
    deleted = pa.table({})
    repairable = []
    newer = pa.table({})
    for kind in (MISSING, STALE, NEWER, DELETED, UNSYNCED, DUPLICATE):
        side = "t" if kind == DELETED else "s"
        rows = classified.filter(pc.equal(classified["kind"], kind))
        rows = rows.select([f"{side}_{key_alias(i)}" for i in range(keys)]).rename_columns(
            [key_alias(i) for i in range(keys)]
        )
        texts = record_keys(rows, [key_alias(i) for i in range(keys)]) if rows.num_rows else pa.array([], pa.string())
        if kind in (MISSING, STALE) and parked and rows.num_rows:
            waiting = pc.is_in(texts, value_set=pa.array(sorted(parked), pa.string()))
            parked_count += int(pc.sum(waiting).as_py() or 0)
            texts = texts.filter(pc.invert(waiting))
            rows = rows.filter(pc.invert(waiting))
        if kind in (MISSING, STALE):
            repairable.append(rows)
        if kind == DELETED:
            deleted = rows
        if kind == NEWER:
            newer = rows
        counts[kind] = len(texts)
        samples[kind] = sorted(texts.slice(0, SAMPLE * 10).to_pylist())[:SAMPLE]
    return Found(counts, samples, parked_count, deleted, pa.concat_tables(repairable), newer)
