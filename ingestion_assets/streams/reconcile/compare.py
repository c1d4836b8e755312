"""One reconciliation: per-bucket counts and checksums on both sides first (one aggregate query each), the
key-by-key diff only for the buckets that differ, then, for a full comparison that applies deletes, the
deletions it found.

Race safety when deleting: the target's writer lock is taken before the source is read and held until the
deletions committed, so no load slips in between; a key is deleted only if the source's snapshot, taken
under that lock, does not hold it at any version.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa

from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.sources.postgres.query import Position, ReadPlan
from ingestion_assets.streams.reconcile.diff import DELETED, DUPLICATE, MISSING, NEWER, STALE, UNSYNCED, Diff
from ingestion_assets.streams.reconcile.figures import Reconciliation, summarize
from ingestion_assets.streams.reconcile.relation import NULL_KEY_BUCKET, Buckets, Scope, key_alias, version_alias
from ingestion_assets.streams.reconcile.source_side import SourceSide
from ingestion_assets.streams.reconcile.target_side import TargetSide, comparable_target

T = TypeVar("T")
U = TypeVar("U")
ROWS_PER_BUCKET = 64  # a difference costs the diff about this many rows per side
MAX_BUCKETS = 1 << 18


@dataclass(frozen=True)
class Request:
    url: str  # the source
    plan: ReadPlan
    loader: Loader
    scope: Scope
    checkpoint: Position | None  # rows at or before it must be in the target
    deletes: str = "report"  # hard | soft: apply the deletions a full comparison finds
    every_key: bool = False  # diff every bucket, even where the checksums agree

    @property
    def applies_deletes(self) -> bool:
        return self.scope.full and self.deletes in ("hard", "soft")

    @property
    def conclusive(self) -> bool:
        """Whether the scope holds every version of its keys on both sides. A window scope (a cursor range) or
        a time partition (an updated row moves to a newer one) does not: keys found on one side only are
        then looked up on the other side outside the scope."""
        window = self.scope.window
        return self.scope.full and (window is None or window.column in self.plan.primary_key)


def reconcile(request: Request) -> Reconciliation:
    """Under the target's writer lock from before the source is read to after the deletions: the target then
    holds still while both sides are compared (a load of another partition cannot pass for a deleted row)."""
    began = time.monotonic()
    with _sides(request) as (source, target):
        found = _compare(request, source, target)
    return dataclasses.replace(found, seconds=round(time.monotonic() - began, 3))


@contextlib.contextmanager
def _sides(request: Request) -> Iterator[tuple[SourceSide, TargetSide]]:
    """Both sides open: the source's snapshot, and the target's client under its writer lock."""
    dialect = comparable_target(request.loader)
    with (
        request.loader.client() as client,
        SourceSide.open(request.url, request.plan, request.scope, dialect) as source,
    ):
        yield source, TargetSide(request.loader, request.plan, request.scope, source.shape, client)


def bucket_count(rows: int) -> int:
    """A power of two near rows / ROWS_PER_BUCKET; the same on both sides (both read the one estimate)."""
    buckets = 1
    while buckets * ROWS_PER_BUCKET < rows and buckets < MAX_BUCKETS:
        buckets *= 2
    return buckets


def _compare(request: Request, source: SourceSide, target: TargetSide) -> Reconciliation:
    buckets = bucket_count(max(source.estimate(), target.estimate()))
    ours, theirs = _both(lambda: source.aggregate(buckets), lambda: target.aggregate(buckets))
    # rows with a NULL key: not comparable by key (the load parks them), counted apart on each side
    keyless, keyless_in_target = ours.pop(NULL_KEY_BUCKET, (0, 0))[0], theirs.pop(NULL_KEY_BUCKET, (0, 0))[0]
    occupied = ours.keys() | theirs.keys()
    differing = sorted(b for b in occupied if ours.get(b) != theirs.get(b))
    chosen = sorted(occupied) if request.every_key else differing
    figures = Reconciliation(
        scope=request.scope.name,
        deletes=request.deletes if request.applies_deletes else "report",
        source_rows=_rows(ours),
        target_rows=_rows(theirs),
        buckets=len(occupied),
        buckets_differing=len(differing),
        null_keys=keyless,
        null_keys_in_target=keyless_in_target,
    )
    if not chosen:
        return figures
    only = None if 2 * len(chosen) >= len(occupied) else chosen
    classified, diffed = _diff(request, source, target, buckets, only)
    found = summarize(classified, len(request.plan.primary_key), target.parked() if classified.num_rows else set())
    applied = target.retire(found.deleted_keys, soft=request.deletes == "soft") if request.applies_deletes else 0
    return dataclasses.replace(
        figures,
        keys_diffed=diffed,
        missing=found.counts[MISSING],
        stale=found.counts[STALE],
        newer_in_target=found.counts[NEWER],
        deleted_at_source=found.counts[DELETED],
        deletions_applied=applied,
        not_yet_synced=found.counts[UNSYNCED],
        parked=found.parked,
        repeated_at_source=found.counts[DUPLICATE],
        samples={kind: keys for kind, keys in found.samples.items() if keys},
        found_keys=found.repairable,
        newer_keys=found.newer,
    )


def recheck(request: Request, keys: pa.Table) -> Reconciliation:
    """`keys` (k0.., as the source side types them) compared again, looked up on both sides whatever their version
    or window: after a repair, whether each is now in the target at the source's version."""
    with _sides(request) as (source, target):
        ours, theirs = _both(lambda: source.lookup(keys), lambda: target.lookup(keys))
        diff = _diff_of(request, ours, theirs)
        try:
            classified = diff.classify(*_ordering(request))
        finally:
            diff.close()
        found = summarize(classified, len(request.plan.primary_key), target.parked() if classified.num_rows else set())
    return Reconciliation(
        scope=request.scope.name,
        missing=found.counts[MISSING],
        stale=found.counts[STALE],
        newer_in_target=found.counts[NEWER],
        deleted_at_source=found.counts[DELETED],
        not_yet_synced=found.counts[UNSYNCED],
        parked=found.parked,
        samples={kind: keys for kind, keys in found.samples.items() if keys},
    )


def _diff(
    request: Request, source: SourceSide, target: TargetSide, buckets: int, only: list[int] | None
) -> tuple[pa.Table, int]:
    """The classified differences of the chosen buckets, and how many rows both sides sent for them."""
    ours, theirs = _both(lambda: source.rows(buckets, only), lambda: target.rows(buckets, only))
    diff = _diff_of(request, ours, theirs)
    try:
        if not request.conclusive:
            diff.add("tgt", target.lookup(diff.only_in("src")))
            diff.add("src", source.lookup(diff.only_in("tgt")))
        return diff.classify(*_ordering(request)), diff.rows
    finally:
        diff.close()


def _diff_of(request: Request, ours: pa.Table, theirs: pa.Table) -> Diff:
    """Both sides' rows joined; numeric text (key or version) ordered by its value."""
    plan = request.plan
    aliases = {key_alias(i): name for i, name in enumerate(plan.primary_key)}
    aliases.update({version_alias(i): name for i, name in enumerate(plan.cursor)})
    numbers = [alias for alias, name in aliases.items() if plan.shape.column(name).is_numeric_text]
    return Diff(ours, theirs, len(plan.primary_key), len(plan.cursor), numbers)


def _both(on_source: Callable[[], T], on_target: Callable[[], U]) -> tuple[T, U]:
    """The source's query runs on its server while the target's runs beside it: the longer one sets the time."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="reconcile-target") as pool:
        theirs = pool.submit(on_target)
        return on_source(), theirs.result()


def _ordering(request: Request) -> tuple[list[str], Position | None, list[str]]:
    """The read order (cursor, then key) as the diff's column aliases, the checkpoint, and the names the
    checkpoint holds those columns under."""
    plan = request.plan
    aliases = [
        version_alias(plan.cursor.index(c.name)) if c.name in plan.cursor else key_alias(plan.primary_key.index(c.name))
        for c in plan.ordering
    ]
    return aliases, request.checkpoint, [c.name for c in plan.ordering]


def _rows(buckets: Buckets) -> int:
    return sum(rows for rows, _ in buckets.values())
