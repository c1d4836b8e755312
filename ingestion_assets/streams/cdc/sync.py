"""A PostgreSQL source in `mode: cdc`: the first run creates the slot and copies every table in checkpointed
key ranges beside the log, later runs apply the slot's changes in commit order. Each stream's checkpoint is the
log position whose changes are all committed in its target; the slot is acknowledged only after those
checkpoints are stored.
A stream without one (added to the catalog, reset, its target replaced, a column added) gets a fenced copy
while the log goes on for the others."""

from __future__ import annotations

import contextlib
import logging
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from hdrh.histogram import HdrHistogram

from ingestion_assets.catalog import Destination, PostgresSource
from ingestion_assets.observe.freshness import empty, percentiles
from ingestion_assets.partitions import LIVE, key_range
from ingestion_assets.references import postgres_url
from ingestion_assets.settings import Settings
from ingestion_assets.sources.postgres.cdc import (
    ChangeBatch,
    DeclaredKey,
    SlotHealth,
    WalGap,
    acknowledge,
    check_cdc,
    create_slot_with_snapshot,
    drop_slot,
    drop_unread_tables,
    ensure_publication,
    find_gap,
    format_lsn,
    parse_lsn,
    read_changes,
    slot_health,
)
from ingestion_assets.sources.postgres.cdc.chunks import (
    ChunkSnapshot,
    chunk_snapshot,
    reading_slot,
    wal_insert_position,
)
from ingestion_assets.sources.postgres.cdc.identity import unpublish_unidentified
from ingestion_assets.sources.postgres.cdc.publication import await_older_writers
from ingestion_assets.streams.cdc.apply import LogLoads, load_changes
from ingestion_assets.streams.cdc.copy import CopyRules, RangeCopied, copy_as_of, copy_range, create_target
from ingestion_assets.streams.cdc.history import HISTORY, Fences, fences_for, history_keys, plan_history
from ingestion_assets.streams.cdc.live import apply_live
from ingestion_assets.streams.cdc.paused import PAUSED, pause_message
from ingestion_assets.streams.cdc.rows import SourceRows, TableChanges, copy_floor, snapshot_version
from ingestion_assets.streams.cdc.schema import PARTITIONS, SCHEMA, StreamParts, settle_stream
from ingestion_assets.streams.cdc.state import COPY, CdcStore, SourceState
from ingestion_assets.streams.postgres_table import PostgresTableStream, Target
from ingestion_assets.streams.target_binding import TARGET
from ingestion_assets.sync import Faults, checkpoint_first

log = logging.getLogger(__name__)
BEHIND_BYTES = 16 * 2**20  # WAL to decode before a copy's next range that is worth telling the operator
SLOT_RELEASE_SECONDS = 10.0
REACH_SECONDS = 120.0  # a chunk run waits this long for the log to reach its snapshot's WAL position


class CdcError(RuntimeError):
    """The log cannot be read safely; the message says why and what to do."""

    transient = False


class LogBehind(CdcError):
    """The slot did not reach a copy's snapshot position in time: nothing of the copy was loaded, a retry may."""

    transient = True


@dataclass
class CdcOutcome:
    mode: str  # snapshot | changes | chunk
    lsn: int
    rows: dict[str, int] = field(default_factory=dict)  # per stream: rows (snapshot) or changes applied
    histogram: HdrHistogram = field(default_factory=empty)  # commit-to-target ms per change (memory stays flat)
    health: SlotHealth | None = None
    dead_letters: int = 0
    checkpoints: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)  # stream -> (lsn, details)
    copied: list[str] = field(default_factory=list)  # streams whose copy beside the log ended in this run
    paused: dict[str, str] = field(default_factory=dict)  # stream -> why it is paused (its table lost its key)
    reasons: dict[str, str] = field(default_factory=dict)  # stream -> why this run copies it again

    def latency(self) -> dict[str, float]:
        """p50/p95/p99 of the commit-to-target latency (ms); empty when no change was applied."""
        return percentiles(self.histogram)


@dataclass
class CdcSync:
    settings: Settings
    destination: Destination
    source_name: str
    source: PostgresSource
    streams: list[PostgresTableStream]
    store: CdcStore
    stop: Callable[[], bool] = field(default=lambda: False)
    log: logging.Logger | Any | None = None
    run_id: str = ""
    faults: Faults | None = None  # the fault points; default from INGEST_FAULT (tests, chaos, the simulation)
    add_partitions: Callable[[list[str]], None] | None = None  # history mode: registers `live` and the key ranges
    _space: dict[str, int] | None = field(default=None, init=False)  # history mode: the key space, kept in checkpoints
    _state: SourceState = field(default_factory=lambda: SourceState({}), init=False)
    _streams: dict[str, StreamParts] = field(default_factory=dict, init=False)  # per stream: loader, shape, schema
    _loads: LogLoads = field(default_factory=LogLoads, init=False)  # what the run's batch loads share
    _applied: array[int] | None = field(default=None, init=False)  # copying: xids applied since the last snapshot

    @property
    def slot(self) -> str:
        return self.source.cdc.slot or f"ingest_{self.source_name}"

    @property
    def publication(self) -> str:
        return self.source.cdc.publication or f"ingest_{self.source_name}"

    def url(self) -> str:
        return postgres_url(
            self.source.connection, self.source.tls, self.settings, f"sources.{self.source_name}.connection"
        )

    def tables(self) -> list[tuple[str, str]]:
        return [(s.spec.schema_name, s.spec.table_name) for s in self.streams]

    def declared_keys(self) -> list[DeclaredKey]:
        return [
            DeclaredKey(s.qualified_name, (s.spec.schema_name, s.spec.table_name), tuple(s.spec.primary_key))
            for s in self.streams
        ]

    @property
    def history(self) -> bool:
        """History as key-range partitions beside the `live` one (else one snapshot copy in the first run)."""
        return self.source.cdc.history_chunk is not None

    def run(self, partition: str | None = None) -> CdcOutcome:
        """Apply the log (`live`, or no partition), or copy one history key range while applying it."""
        url = self.url()
        with reading_slot(url, self.slot, self.source.cdc.lock_wait_seconds):
            outcome = self._run(url, partition)
        outcome.reasons = dict(self._state.reasons)
        if outcome.mode != "chunk":
            outcome.checkpoints = {
                name: (position, self._details(name))
                for name, position in self._state.positions.items()
                if position is not None
            }
        return outcome

    def _run(self, url: str, partition: str | None) -> CdcOutcome:
        stored = self.store.latest()
        paused = self._pause_unidentified(url, stored)  # the other streams go on
        outcome = self._run_streams(url, partition, stored) if self.streams else CdcOutcome("changes", 0)
        outcome.paused = paused
        return outcome

    def _run_streams(self, url: str, partition: str | None, stored: dict[str, Any]) -> CdcOutcome:
        self._state = SourceState({s.name: stored.get(s.name) for s in self.streams})
        for name, checkpoint in stored.items():
            if checkpoint and checkpoint.get(PAUSED) and name in self._state.positions:
                self._state.recopy(name, "its table has a replica identity again after a pause")
                self._say("%s.%s: copying its table again: it has a replica identity again", self.source_name, name)
        # A missing slot is no check's failure: `_resync_at_gap` makes it again (on_wal_gap: resync) or says
        # which streams to re-copy (fail).
        published = self._preflight(url)  # read-only checks, then the publication
        live = partition is None or partition == LIVE
        if live:
            self._settle_streams()
            self._recopy_stale(url, published)
        if not self._state.started:
            if not self.history:
                return self._live_after(url, self._snapshot(url))
            self._start_log(url)
        self._space = next((c[HISTORY] for c in self._state.checkpoints.values() if c and c.get(HISTORY)), self._space)
        if self.history and self.add_partitions is not None:
            self.add_partitions(history_keys({HISTORY: self._space}))
        lsn = self._state.low
        gap = self._resync_at_gap(url, lsn)
        if gap is not None:
            for name in self._state.positions:
                self._state.recopy(name, f"resync (on_wal_gap: resync): {gap}")
            return self._snapshot(url)
        if not live:
            if not self.history:
                raise CdcError(f"source {self.source_name} has no history partitions (cdc.history_chunk is unset)")
            return self._chunk(url, lsn, partition or "")
        outcome = CdcOutcome("changes", lsn)
        if self._state.copying():
            self._copy_streams(url, outcome)
        if self.source.cdc.live_seconds is None:
            self._changes(url, outcome)
            return outcome
        return self._live_after(url, outcome)

    def _pause_unidentified(self, url: str, stored: dict[str, Any]) -> dict[str, str]:
        """Streams whose table lost its replica identity after it was published (a primary key dropped): the
        table leaves the product's publication at once (the application's UPDATE and DELETE on it fail while
        it is published), the stream is paused and left out of this run, and its checkpoint holds no position:
        once the table has an identity again it is copied again. A table never streamed is not paused: the
        pre-flight check refuses it before anything is published."""
        owned = self.source.cdc.publication is None
        found = unpublish_unidentified(url, self.publication, self.tables(), owned)
        by_table = {(s.spec.schema_name, s.spec.table_name): s for s in self.streams}
        paused: dict[str, str] = {}
        for entry in found:
            stream = by_table[entry.table]
            checkpoint = stored.get(stream.name) or {}
            if not (entry.published or checkpoint.get("snapshot_done") or checkpoint.get(PAUSED)):
                continue
            paused[stream.name] = pause_message(self.source_name, stream.name, self.publication, entry)
            self._say("%s", paused[stream.name])
            if not checkpoint.get(PAUSED):
                lsn = parse_lsn(str(checkpoint["lsn"])) if checkpoint.get("lsn") else 0
                self.store.commit(lsn, {stream.name: {"snapshot_done": False, PAUSED: paused[stream.name]}})
        self.streams = [s for s in self.streams if s.name not in paused]
        return paused

    def _live_after(self, url: str, outcome: CdcOutcome) -> CdcOutcome:
        """With cdc.live_seconds the run stays up applying the log (after its snapshot, too)."""
        if self.source.cdc.live_seconds is not None and not self.stop():
            apply_live(self, url, outcome)
        return outcome

    def _settle_streams(self) -> None:
        """Per stream: its schema against the stored one, and its target against its checkpoint. A stream whose
        columns changed or whose target does not hold what its checkpoint says is copied again (and says why)."""
        partition = LIVE if self.history else None
        for stream in self.streams:
            details = self._state.details(stream.name)
            parts = settle_stream(stream, details, partition, self.history)
            self._streams[stream.name] = parts
            if self._state.positions.get(stream.name) is not None and parts.recopy:
                self._recopy(stream, parts.recopy)

    def _recopy_stale(self, url: str, published: tuple[tuple[str, str], ...]) -> None:
        """Streams whose checkpoint the log can no longer serve while the slot still serves the others get a
        fresh copy, as a new stream does: a stream back in the catalog after a while out of it (its table was
        taken out of the publication meanwhile, so the log holds none of its changes since; or the slot was
        acknowledged past its checkpoint by the runs of the other streams)."""
        for stream in self.streams:
            table = (stream.spec.schema_name, stream.spec.table_name)
            if table in published and self._state.positions.get(stream.name) is not None:
                why = f"its table was not in the publication {self.publication} (the stream was out of the catalog?)"
                self._recopy(stream, f"{why}: the log holds none of its changes since its checkpoint")
        if not self._state.started:
            return
        gap = find_gap(url, self.slot, self._state.low)
        acknowledged = gap.acknowledged_lsn if gap is not None else None
        if acknowledged is None or not any(p is not None and p >= acknowledged for p in self._state.positions.values()):
            return  # the slot serves every stream, or none: a WAL gap of the source (`_resync_at_gap`)
        for stream in self.streams:
            position = self._state.positions.get(stream.name)
            if position is not None and position < acknowledged:
                self._recopy(
                    stream,
                    f"its checkpoint {format_lsn(position)} is behind the slot {self.slot}, which the runs of the "
                    f"other streams acknowledged up to {format_lsn(acknowledged)} (the stream was out of the "
                    "catalog?): the log no longer holds its changes in between",
                )

    def _recopy(self, stream: PostgresTableStream, reason: str) -> None:
        self._state.recopy(stream.name, reason)
        self._say("%s: copying its table again: %s", stream.qualified_name, reason)

    def _resync_at_gap(self, url: str, lsn: int) -> WalGap | None:
        """None if the slot can deliver every change after `lsn`; the gap if the slot was dropped (or was gone
        already) to start over (on_wal_gap: resync); else it stops with the commands that re-copy the source."""
        gap = find_gap(url, self.slot, lsn)
        if gap is None:
            return None
        if self.source.cdc.on_wal_gap == "resync" and not self.history:
            self._say(
                "%s: %s; resyncing every stream from a new slot %s and a fresh snapshot (on_wal_gap: resync)",
                self.source_name,
                gap,
                self.slot,
            )
            drop_slot(url, self.slot)
            return gap
        behind = [s for s in self.streams if self._lost_to(s.name, gap)]
        resets = ", ".join(f"`ingest state reset {self.source_name}.{s.name}`" for s in behind or self.streams)
        again = (
            f"Reset `live` of every stream ({resets}, each with `--partition live`), run it, then backfill the "
            "history ranges again"
            if self.history
            else f"This source has on_wal_gap: {self.source.cdc.on_wal_gap}. Re-copy the streams it concerns "
            f"({resets}; the next run copies them again), or set cdc.on_wal_gap: resync (the next run then makes the "
            "slot again and copies every stream)"
        )
        raise CdcError(
            f"source {self.source_name}: the slot {self.slot} can no longer deliver the changes after the "
            f"checkpoint {format_lsn(lsn)} ({gap}). Rows changed in between would be missed. {again}"
        )

    def _lost_to(self, name: str, gap: WalGap) -> bool:
        """The stream holds a position the gap took changes after (a slot acknowledged past some positions only
        concerns the streams behind it; a missing or invalidated slot concerns every stream with a position)."""
        position = self._state.positions.get(name)
        if position is None:
            return False
        return gap.acknowledged_lsn is None or position < gap.acknowledged_lsn

    def _start_log(self, url: str) -> None:
        """History mode, first run: a new slot; the key space of the rows that exist now is the history."""
        with _existing_slot_dropped(url, self.slot), create_slot_with_snapshot(url, self.slot) as snap:
            lsn = snap.consistent_lsn
        chunk = self.source.cdc.history_chunk
        assert chunk is not None
        self._space = plan_history(url, self.streams, chunk)
        self._commit(lsn, [s.name for s in self.streams])

    def _chunk(self, url: str, lsn: int, partition: str) -> CdcOutcome:
        """One history key range: the log up to a fresh snapshot, then the range's rows as of it."""
        low, high = key_range(partition)
        outcome = CdcOutcome("chunk", lsn)
        self._applied = array("I")
        self._catch_up(url, outcome, f"the history range {partition}")
        with self._fenced_snapshot(url, outcome, self.streams) as (snap, fences):
            version = snapshot_version(snap.lsn)
            rules = self._rules()
            for stream in self.streams:
                table = (stream.spec.schema_name, stream.spec.table_name)
                if table in fences.truncated:
                    continue  # emptied after the snapshot: what it holds now came through the log
                copied = copy_as_of(url, stream, snap.name, version, rules, (low, high), fences, copy_floor(lsn))
                outcome.rows[stream.name] = outcome.rows.get(stream.name, 0) + copied
        return outcome

    def _snapshot(self, url: str) -> CdcOutcome:
        """A new slot: every stream starts its copy at the slot's first position, then copies its table in
        key ranges beside the log (`_copy_streams`), so a crash costs at most one range."""
        with _existing_slot_dropped(url, self.slot), create_slot_with_snapshot(url, self.slot) as snap:
            lsn = snap.consistent_lsn
        # Only once the block is left: a failure inside it drops the new slot, which a stored checkpoint
        # would then point at (found by simulation seed 2013, cdc).
        for stream in self.streams:
            self._state.start_copy(stream.name, lsn, str(copy_floor(lsn)))
        self._commit(lsn, [s.name for s in self.streams])
        outcome = CdcOutcome("snapshot", lsn)
        self._copy_streams(url, outcome)
        outcome.health = slot_health(url, self.slot)
        return outcome

    def _copy_streams(self, url: str, outcome: CdcOutcome) -> None:
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
        names = self._state.copying()
        starting = [name for name in names if self._state.positions.get(name) is None]
        if starting:
            self._catch_up(url, outcome, f"the copy of {', '.join(names)}")
        for name in names:
            under_way = self._state.copies.get(name)
            if under_way is not None and under_way.ranges:
                self._say(
                    "%s.%s: going on with its copy after %d range(s), %d row(s)",
                    self.source_name,
                    name,
                    under_way.ranges,
                    under_way.rows,
                )
            elif name not in self._state.reasons:
                self._say("%s.%s: copying its table (new to the source, first run, or reset)", self.source_name, name)
            self._state.start_copy(name, outcome.lsn, str(copy_floor(outcome.lsn)))
        # Stored as begun: a run that fails before the first range goes on with the copy, even when what made it
        # needed (a table put back in the publication, a slot acknowledged past it) no longer shows.
        self._commit(outcome.lsn, starting)
        await_older_writers(url, self.source.cdc.lock_wait_seconds)
        copying = [s for s in self.streams if s.name in names]
        for stream in copying:
            create_target(self._parts(stream).loader, self._parts(stream).shape)
        self._applied = array("I")
        while copying and not self.stop():
            copying = self._copy_range(url, outcome, copying)
        self._applied = None  # a run that goes on applying the log (live) keeps no list
        outcome.copied = [name for name in names if name not in self._state.copies]

    def _copy_range(
        self, url: str, outcome: CdcOutcome, copying: list[PostgresTableStream]
    ) -> list[PostgresTableStream]:
        """The next range of each stream's copy under one fresh snapshot; returns the streams not done."""
        self._catch_up(url, outcome, f"the next range of {', '.join(s.qualified_name for s in copying)}")
        with self._fenced_snapshot(url, outcome, copying) as (snap, fences):
            version = snapshot_version(snap.lsn)
            for stream in copying:
                self._next_range(url, stream, snap.name, version, fences, outcome)
        self._commit(outcome.lsn, [s.name for s in copying])
        return [s for s in copying if s.name in self._state.copies]

    def _next_range(
        self,
        url: str,
        stream: PostgresTableStream,
        snapshot: str,
        version: Decimal,
        fences: Fences,
        outcome: CdcOutcome,
    ) -> None:
        """One range of the stream's copy; after its last, the rows below the copy's floor retire."""
        progress = self._state.copies[stream.name]
        loader = self._parts(stream).loader
        if (stream.spec.schema_name, stream.spec.table_name) in fences.truncated:
            copied = RangeCopied(0, progress.after, True)  # emptied since the snapshot: the log holds all it has
        else:
            after, index = progress.after, progress.ranges
            copied = copy_range(url, stream, snapshot, version, self._rules(), after, fences, loader, index)
        progress.after, progress.ranges, progress.rows = copied.last, progress.ranges + 1, progress.rows + copied.rows
        outcome.rows[stream.name] = outcome.rows.get(stream.name, 0) + copied.rows
        if copied.done:
            # A copy stored without a floor (never written so since floors are set at its start) retires nothing.
            loader.retire_below(Decimal(progress.floor or 0), stream.spec.deletes == "soft")
            if not progress.rows:  # a copy of an empty table (every partition detached): an empty target is no loss
                self._parts(stream).empty = not loader.inspect(LIVE if self.history else None).has_rows
            del self._state.copies[stream.name]

    def _catch_up(self, url: str, outcome: CdcOutcome, before: str) -> None:
        """The log up to where the server writes now, with no snapshot held: a snapshot held open holds back
        vacuum on the whole source, so a copy's snapshot is then held only while the changes written since
        are applied and its rows read (found by the CDC attack: 12 minutes held with a 1 GB backlog)."""
        now = wal_insert_position(url)
        if now <= outcome.lsn:
            return
        if now - outcome.lsn > BEHIND_BYTES:
            behind = f"{(now - outcome.lsn) / 2**20:,.0f} MB"
            self._say("%s: applying %s of log before %s", self.source_name, behind, before)
        self._changes(url, outcome, reach=now)

    @contextlib.contextmanager
    def _fenced_snapshot(
        self, url: str, outcome: CdcOutcome, streams: list[PostgresTableStream]
    ) -> Iterator[tuple[ChunkSnapshot, Fences]]:
        """A snapshot for a copy, and the log applied up to it with the keys of every transaction it does not
        see fenced. A snapshot that lists as running a transaction committed before it that the log did not
        bring after it (`Fences.unfenceable`: applied already, e.g. while its session waited for a synchronous
        standby) is let go and taken again, the log read on, until none is left."""
        deadline = time.monotonic() + REACH_SECONDS
        while True:
            with chunk_snapshot(url) as snap:
                before, self._applied = self._applied or array("I"), array("I")
                fences = fences_for(snap, streams)
                self._changes(url, outcome, reach=snap.lsn, fences=fences)
                waiting = fences.unfenceable(before)
                if not waiting:
                    yield snap, fences
                    return
                before.extend(self._applied)
                self._applied = before
            if time.monotonic() > deadline:
                raise LogBehind(
                    f"source {self.source_name}: for {REACH_SECONDS:.0f} s every snapshot listed as running "
                    f"transactions committed already (xids {waiting[:5]}: waiting for a synchronous standby?); a "
                    "copy under it would set their rows back. Nothing was copied; retry the run"
                )
            time.sleep(0.05)

    def _rules(self) -> CopyRules:
        faults = self.faults or Faults.from_env()
        return CopyRules(self.source.cdc.snapshot_slice_rows, self.run_id, faults, self.history)

    def _changes(self, url: str, outcome: CdcOutcome, reach: int | None = None, fences: Fences | None = None) -> None:
        """Batches of the log, each loaded, checkpointed, then acknowledged. With `reach` (a copy's snapshot),
        go on until every transaction committed before that WAL position is applied, and show each to `fences`."""
        self._slot_ready(url)
        faults = self.faults or Faults.from_env()
        unsafe = checkpoint_first()
        deadline = time.monotonic() + REACH_SECONDS
        session = self.source.cdc.max_seconds
        index = 0
        while reach is not None or index < self.source.cdc.max_batches_per_run:
            if reach is not None and outcome.lsn >= reach:
                break
            batch = read_changes(
                url,
                self.slot,
                self.publication,
                outcome.lsn,
                max_changes=self.source.cdc.max_changes,
                max_seconds=session,
            )
            if batch.end_lsn <= outcome.lsn and not batch.transactions:
                if reach is None:
                    break
                self._wait_for_wal(reach, outcome.lsn, deadline)
                # A session decodes from the slot's restart position: one big transaction (a bulk load, even
                # of a table not published) may need longer than max_seconds before anything arrives.
                session = min(session * 2, REACH_SECONDS)
                continue
            deadline, session = time.monotonic() + REACH_SECONDS, self.source.cdc.max_seconds
            if self._applied is not None:
                self._applied.extend(tx.xid % 2**32 for tx in batch.transactions)
            if fences is not None:
                fences.see(batch)
            if unsafe:  # never in production: checkpoint first, so a crash in the load loses the batch
                self._commit(batch.end_lsn)
            faults.hit("before_load", index)
            self._apply(url, batch, outcome, fences)
            faults.hit("after_load", index)
            if not unsafe:
                self._commit(batch.end_lsn)
            faults.hit("after_checkpoint", index)
            acknowledge(url, self.slot, self.publication, batch.end_lsn)  # only behind stored checkpoints
            outcome.lsn = batch.end_lsn
            index += 1
            if reach is None and (batch.caught_up or self.stop()):
                break
        outcome.health = slot_health(url, self.slot)

    def _commit(self, lsn: int, names: list[str] | None = None) -> None:
        """Checkpoint `lsn` for the named streams (default: every stream that holds a position below it)."""
        if names is None:
            names = [n for n, p in self._state.positions.items() if p is not None and p < lsn]
        for name in names:
            self._state.positions[name] = lsn
        if names:
            self.store.commit(lsn, {name: self._details(name) for name in names})

    def _details(self, name: str) -> dict[str, Any]:
        """What the stream's checkpoint keeps beside its position. A history range run settles no schema or
        binding: it keeps those of the stream's last checkpoint."""
        stored = self._state.details(name)
        extra: dict[str, Any] = {k: stored[k] for k in (SCHEMA, TARGET, PARTITIONS) if k in stored}
        if self.history:
            extra[HISTORY] = self._space
        if name in self._state.copies:
            extra[COPY] = self._state.copies[name].stored()
        parts = self._streams.get(name)
        if parts is not None:
            extra |= parts.checkpoint_details()
        return {"snapshot_done": True, "slot": self.slot, **extra}

    def _wait_for_wal(self, reach: int, at: int, deadline: float) -> None:
        if time.monotonic() > deadline:
            raise LogBehind(
                f"source {self.source_name}: the slot {self.slot} stayed at {format_lsn(at)} for "
                f"{REACH_SECONDS:.0f} s, short of the snapshot's position {format_lsn(reach)} (a transaction of "
                "that size may take longer to decode: raise cdc.max_seconds); "
                "nothing was loaded from the copy, retry the run"
            )
        time.sleep(0.2)

    def _apply(self, url: str, batch: ChangeBatch, outcome: CdcOutcome, fences: Fences | None) -> None:
        by_table = {(s.spec.schema_name, s.spec.table_name): s for s in self.streams}
        pending: dict[str, TableChanges] = {}
        source_rows = SourceRows(url)
        try:
            self._gather(batch, by_table, pending, source_rows, fences)
        finally:
            source_rows.close()
        load_changes(self, pending, outcome)  # one load for every table where the destination allows it

    def _gather(
        self,
        batch: ChangeBatch,
        by_table: dict[tuple[str, str], PostgresTableStream],
        pending: dict[str, TableChanges],
        source_rows: SourceRows,
        fences: Fences | None,
    ) -> None:
        for tx in batch.transactions:
            for change in tx.changes:
                stream = by_table.get((change.table.schema, change.table.table))
                if stream is None or not self._wants(stream.name, tx.xid, tx.end_lsn, fences):
                    continue
                if stream.name in self._state.copies and self._parts(stream).outdated(stream, change.table):
                    # Made before the type change that (this run, or the next one) copies the table again:
                    # every range's snapshot sees it, so the copy brings what it left and retires what it deleted.
                    continue
                # A copy under way rebuilds the target anyway: the truncate empties what it copied so far, and
                # later ranges and the log bring what the table holds after it.
                refused = stream.spec.truncate == "refuse" and stream.name not in self._state.copies
                if change.op.value == "truncate" and refused:
                    raise CdcError(
                        f"stream {stream.qualified_name}: the source table was truncated at "
                        f"{format_lsn(change.commit_lsn)} and the stream refuses truncates (it would empty the "
                        f"target). Set `truncate: apply` to follow it, or copy the table again with `ingest state "
                        f"reset {stream.qualified_name}`; nothing after it was applied"
                    )
                parts = self._parts(stream)
                changes = pending.get(stream.name)
                if changes is None:
                    key = tuple(stream.spec.primary_key)
                    generated = parts.generated_columns(stream)
                    changes = TableChanges(parts.shape, key, soft=stream.spec.deletes == "soft", generated=generated)
                    pending[stream.name] = changes
                changes.add(change, source_rows.lookup(stream, parts.shape))

    def _wants(self, name: str, xid: int, end_lsn: int, fences: Fences | None) -> bool:
        """A stream being copied takes only what its copy's snapshot does not see; the others what their own
        checkpoint is not past yet."""
        if self._state.positions.get(name) is None:
            return fences is not None and not fences.snapshot.sees(xid)
        return not self._state.applied(name, end_lsn)

    def _parts(self, stream: PostgresTableStream) -> StreamParts:
        """A history range run settles no schema or binding: it takes the table as it is."""
        parts = self._streams.get(stream.name)
        if parts is None:
            parts = StreamParts(stream.loader(Target(stream.name, 1), None, guard=self.history), stream.discover())
            parts.loader.run_id = self.run_id
            self._streams[stream.name] = parts
        return parts

    def _preflight(self, url: str) -> tuple[tuple[str, str], ...]:
        """Every check first, read-only; only a source that passes them all gets its publication made or
        extended (returns the tables it added). A table that fails (no key, no replica identity) is never
        published: publishing it would make the source application's own UPDATEs and DELETEs on it fail."""
        self._check(url, expect_slot=False)
        added = ensure_publication(
            url, self.publication, self.tables(), partition_root=True, owned=self.source.cdc.publication is None
        )
        if added:
            published = ", ".join(".".join(t) for t in added)
            self._say("%s: published %s in %s", self.source_name, published, self.publication)
        if self.source.cdc.publication is None:  # ours: a table no stream of the catalog reads leaves it
            read = [(spec.schema_name, spec.table_name) for spec in self.source.streams.values()]
            dropped = drop_unread_tables(url, self.publication, read)
            if dropped:
                left = ", ".join(".".join(t) for t in dropped)
                self._say(
                    "%s: no stream reads %s any more: taken out of %s (its target table is kept as it was)",
                    self.source_name,
                    left,
                    self.publication,
                )
        return tuple(added)

    def _slot_ready(self, url: str) -> None:
        self._check(url, expect_slot=True)

    def _check(self, url: str, expect_slot: bool) -> None:
        deadline = time.monotonic() + SLOT_RELEASE_SECONDS
        tables, keys = self.tables(), self.declared_keys()
        check = lambda: check_cdc(url, self.slot, self.publication, tables, expect_slot, True, keys)  # noqa: E731
        problems = check()
        # The walsender of the previous run (or of a crashed one) leaves the slot a moment after its client.
        while problems and all(p.transient for p in problems) and time.monotonic() < deadline:
            time.sleep(0.25)
            problems = check()
        if problems:
            raise CdcError(
                f"source {self.source_name} cannot capture changes (nothing was changed on the source): "
                + "; ".join(str(p) for p in problems)
            )

    def _say(self, message: str, *args: Any) -> None:
        (self.log or log).warning(message, *args)


class _existing_slot_dropped:
    """A slot left by a snapshot that never completed is useless (its copy is gone): start over."""

    def __init__(self, url: str, slot: str) -> None:
        self.url, self.slot = url, slot

    def __enter__(self) -> None:
        drop_slot(self.url, self.slot)

    def __exit__(self, *_exc: object) -> None:
        return None
