"""Copies beside the log: a new slot's first copy, a stream's copy in checkpointed key ranges (each under a
fresh snapshot fenced against the log), and one history key range."""

from __future__ import annotations

import contextlib
import time
from array import array
from collections.abc import Iterator
from decimal import Decimal
from typing import TYPE_CHECKING

from ingestion_assets.partitions import LIVE, key_range
from ingestion_assets.sources.postgres.cdc import create_slot_with_snapshot, drop_slot, slot_health
from ingestion_assets.sources.postgres.cdc.chunks import ChunkSnapshot, chunk_snapshot
from ingestion_assets.sources.postgres.cdc.publication import await_older_writers
from ingestion_assets.sources.postgres.cdc.snapshot import SlotSnapshot
from ingestion_assets.sources.postgres.cdc.waits import told_while_waiting
from ingestion_assets.streams.cdc.batches import REACH_SECONDS, apply_log, catch_up
from ingestion_assets.streams.cdc.copy import CopyRules, RangeCopied, copy_as_of, copy_range, create_target
from ingestion_assets.streams.cdc.history import Fences, fences_for, plan_history
from ingestion_assets.streams.cdc.names import pause_copied
from ingestion_assets.streams.cdc.outcome import CdcOutcome, ColumnsUnlandable, LogBehind
from ingestion_assets.streams.cdc.rows import copy_floor, snapshot_version
from ingestion_assets.streams.postgres_table import PostgresTableStream
from ingestion_assets.sync import Faults

if TYPE_CHECKING:
    from ingestion_assets.streams.cdc.sync import CdcSync


def snapshot(sync: CdcSync, url: str) -> CdcOutcome:
    """A new slot: every stream starts its copy at the slot's first position, then copies its table in
    key ranges beside the log (`copy_streams`), so a crash costs at most one range."""
    with _slot_created(sync, url) as snap:
        lsn = snap.consistent_lsn
    # Only once the block is left: a failure inside it drops the new slot, which a stored checkpoint
    # would then point at (found by simulation seed 2013, cdc).
    for stream in sync.streams:
        sync._state.start_copy(stream.name, lsn, str(copy_floor(lsn)))
    sync._commit(lsn, [s.name for s in sync.streams])
    outcome = CdcOutcome("snapshot", lsn)
    copy_streams(sync, url, outcome)
    outcome.health = slot_health(url, sync.slot)
    return outcome


@contextlib.contextmanager
def _slot_created(sync: CdcSync, url: str) -> Iterator[SlotSnapshot]:
    """A new slot and its snapshot; creating it waits for the transactions open at the source, said while it
    does (a session left idle in a transaction holds the first copy for as long as it stays open)."""
    waiting = f"source {sync.source_name}: creating replication slot {sync.slot} for the first copy"
    with (
        told_while_waiting(url, waiting, sync._say),
        _existing_slot_dropped(url, sync.slot),
        create_slot_with_snapshot(url, sync.slot) as snap,
    ):
        yield snap


def start_log(sync: CdcSync, url: str) -> None:
    """History mode, first run: a new slot; the key space of the rows that exist now is the history."""
    with _slot_created(sync, url) as snap:
        lsn = snap.consistent_lsn
    chunk = sync.source.cdc.history_chunk
    assert chunk is not None
    sync._space = plan_history(url, sync.streams, chunk)
    sync._commit(lsn, [s.name for s in sync.streams])


def chunk(sync: CdcSync, url: str, lsn: int, partition: str) -> CdcOutcome:
    """One history key range: the log up to a fresh snapshot, then the range's rows as of it."""
    low, high = key_range(partition)
    outcome = CdcOutcome("chunk", lsn)
    sync._applied = array("I")
    catch_up(sync, url, outcome, f"the history range {partition}")
    with fenced_snapshot(sync, url, outcome, sync.streams) as (snap, fences):
        version = snapshot_version(snap.lsn)
        copy_rules = rules(sync)
        for stream in sync.streams:
            table = (stream.spec.schema_name, stream.spec.table_name)
            if table in fences.truncated:
                continue  # emptied after the snapshot: what it holds now came through the log
            copied = copy_as_of(url, stream, snap.name, version, copy_rules, (low, high), fences, copy_floor(lsn))
            outcome.rows[stream.name] = outcome.rows.get(stream.name, 0) + copied.rows
            outcome.dead_letters += copied.parked
    return outcome


def copy_streams(sync: CdcSync, url: str, outcome: CdcOutcome) -> None:
    """Streams without a position (new, reset, rebound, columns changed) or whose copy is under way: their
    tables in key ranges (keyset order of the primary key, one slice each), every range under a fresh
    snapshot while the log is applied up to that snapshot's WAL position for every stream, and then
    checkpointed (the last key copied), so a crash costs one range and the next run goes on after it.

    Exactness. A stream whose copy starts takes a position (the run's) and from then on takes *every*
    change of the log after it, in copied ranges and in ranges not copied yet. A range's rows are as of
    its snapshot, less the keys of transactions the snapshot does not see (fenced: the log has them), so
    it overwrites only values at least as new as what the log put there; a key the log touched in an
    uncopied range is copied over later by a snapshot that sees that change; a row deleted in a range
    copied already is deleted by the log. Taking log changes for the copied part of the key space only
    would need every change split by key (a key update moving a row across the copy's boundary), and
    rows of an uncopied range need no protection from the log: their range's snapshot is newer.
    When the last range is copied the copy has covered the whole key space: every row the source holds
    is then at a version at or above the copy's floor (copied, or fenced and changed by the log since the
    copy started: `copy_floor`), so the rows left below it — from before a reset or a WAL gap, deleted in
    the source since — are retired, in the whole table.

    A copy that starts now starts after the log is caught up (a stream without a position takes nothing of
    it): its floor is then past the change that made it necessary. Rows can leave a table without a delete
    in the log (DETACH or DROP of a partition); changed in the log after the other streams' position and
    before that, they would get versions above a floor at that position and never be retired."""
    names = sync._state.copying()
    starting = [name for name in names if sync._state.positions.get(name) is None]
    if starting:
        catch_up(sync, url, outcome, f"the copy of {', '.join(names)}")
    for name in names:
        under_way = sync._state.copies.get(name)
        if under_way is not None and under_way.ranges:
            sync._say(
                "%s.%s: going on with its copy after %d range(s), %d row(s)",
                sync.source_name,
                name,
                under_way.ranges,
                under_way.rows,
            )
        elif under_way is not None and name not in sync._state.begun:  # an earlier run failed before its first range
            sync._say("%s.%s: going on with the copy an earlier run began", sync.source_name, name)
        elif name not in sync._state.reasons:
            sync._say("%s.%s: copying its table (new to the source, first run, or reset)", sync.source_name, name)
        sync._state.start_copy(name, outcome.lsn, str(copy_floor(outcome.lsn)))
    # Stored as begun: a run that fails before the first range goes on with the copy, even when what made it
    # needed (a table put back in the publication, a slot acknowledged past it) no longer shows.
    sync._commit(outcome.lsn, starting)
    waiting = f"source {sync.source_name}: the copy of {', '.join(names)} waits for the writers older than it"
    with told_while_waiting(url, waiting, sync._say):
        await_older_writers(url, sync.source.cdc.lock_wait_seconds)
    copying = [s for s in sync.streams if s.name in names]
    for stream in copying:
        create_target(sync._parts(stream).loader, sync._parts(stream).shape)
    sync._applied = array("I")
    while copying and not sync.stop():
        copying = _copy_range(sync, url, outcome, copying)
    sync._applied = None  # a run that goes on applying the log (live) keeps no list
    outcome.copied = [name for name in names if name not in sync._state.copies and name not in sync.refused]


def _copy_range(
    sync: CdcSync, url: str, outcome: CdcOutcome, copying: list[PostgresTableStream]
) -> list[PostgresTableStream]:
    """The next range of each stream's copy under one fresh snapshot; returns the streams not done. A stream
    whose table took a column that cannot land since its copy began is paused, and the others go on."""
    catch_up(sync, url, outcome, f"the next range of {', '.join(s.qualified_name for s in copying)}")
    unlandable: dict[str, str] = {}
    with fenced_snapshot(sync, url, outcome, copying) as (snap, fences):
        version = snapshot_version(snap.lsn)
        for stream in copying:
            try:
                _next_range(sync, url, stream, snap.name, version, fences, outcome)
            except ColumnsUnlandable as exc:  # nothing of its range was loaded
                unlandable[stream.name] = exc.problem
                sync.loading = []
    if unlandable:
        pause_copied(sync, url, unlandable)
    copying = [s for s in copying if s.name not in unlandable]
    sync._commit(outcome.lsn, [s.name for s in copying])
    return [s for s in copying if s.name in sync._state.copies]


def _next_range(
    sync: CdcSync,
    url: str,
    stream: PostgresTableStream,
    snapshot: str,
    version: Decimal,
    fences: Fences,
    outcome: CdcOutcome,
) -> None:
    """One range of the stream's copy; after its last, the rows below the copy's floor retire."""
    progress = sync._state.copies[stream.name]
    loader = sync._parts(stream).loader
    if (stream.spec.schema_name, stream.spec.table_name) in fences.truncated:
        copied = RangeCopied(0, progress.after, True)  # emptied since the snapshot: the log holds all it has
    else:
        after, index = progress.after, progress.ranges
        sync.loading = [stream.qualified_name]
        copied = copy_range(url, stream, snapshot, version, rules(sync), after, fences, loader, index)
        sync.loading = []
    progress.after, progress.ranges, progress.rows = copied.last, progress.ranges + 1, progress.rows + copied.rows
    outcome.rows[stream.name] = outcome.rows.get(stream.name, 0) + copied.rows
    outcome.dead_letters += copied.parked
    if copied.done:
        # A copy stored without a floor (never written so since floors are set at its start) retires nothing.
        loader.retire_below(Decimal(progress.floor or 0), stream.spec.deletes == "soft")
        if not progress.rows:  # a copy of an empty table (every partition detached): an empty target is no loss
            sync._parts(stream).empty = not loader.inspect(LIVE if sync.history else None).has_rows
        del sync._state.copies[stream.name]


@contextlib.contextmanager
def fenced_snapshot(
    sync: CdcSync, url: str, outcome: CdcOutcome, streams: list[PostgresTableStream]
) -> Iterator[tuple[ChunkSnapshot, Fences]]:
    """A snapshot for a copy, and the log applied up to it with the keys of every transaction it does not
    see fenced. A snapshot that lists as running a transaction committed before it that the log did not
    bring after it (`Fences.unfenceable`: applied already, e.g. while its session waited for a synchronous
    standby) is let go and taken again, the log read on, until none is left."""
    deadline = time.monotonic() + REACH_SECONDS
    while True:
        with chunk_snapshot(url) as snap:
            before, sync._applied = sync._applied or array("I"), array("I")
            fences = fences_for(snap, streams)
            apply_log(sync, url, outcome, reach=snap.lsn, fences=fences)
            waiting = fences.unfenceable(before)
            if not waiting:
                yield snap, fences
                return
            before.extend(sync._applied)
            sync._applied = before
        if time.monotonic() > deadline:
            raise LogBehind(
                f"source {sync.source_name}: for {REACH_SECONDS:.0f} s every snapshot listed as running "
                f"transactions committed already (xids {waiting[:5]}: waiting for a synchronous standby?); a "
                "copy under it would set their rows back. Nothing was copied; retry the run"
            )
        time.sleep(0.05)


def rules(sync: CdcSync) -> CopyRules:
    faults = sync.faults or Faults.from_env()
    return CopyRules(sync.source.cdc.snapshot_slice_rows, sync.run_id, faults, sync.history)


class _existing_slot_dropped:
    """A slot left by a snapshot that never completed is useless (its copy is gone): start over."""

    def __init__(self, url: str, slot: str) -> None:
        self.url, self.slot = url, slot

    def __enter__(self) -> None:
        drop_slot(self.url, self.slot)

    def __exit__(self, *_exc: object) -> None:
        return None
