"""A PostgreSQL source in `mode: cdc`: the first run copies every table under the slot's exported snapshot,
later runs apply the slot's changes in commit order. The checkpoint is the log position whose changes are
all committed in the target; the slot is acknowledged only after that checkpoint is stored."""

from __future__ import annotations

import datetime as dt
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ingestion_assets.catalog import Destination, PostgresSource
from ingestion_assets.partitions import LIVE, key_range
from ingestion_assets.references import resolve
from ingestion_assets.settings import Settings
from ingestion_assets.sources.postgres.cdc import (
    ChangeBatch,
    SlotHealth,
    acknowledge,
    check_cdc,
    create_slot_with_snapshot,
    drop_slot,
    ensure_publication,
    find_gap,
    format_lsn,
    parse_lsn,
    read_changes,
    slot_health,
)
from ingestion_assets.sources.postgres.cdc.chunks import chunk_snapshot, reading_slot
from ingestion_assets.streams.cdc_copy import CopyRules, copy_as_of
from ingestion_assets.streams.cdc_history import HISTORY, Fences, fences_for, history_keys, plan_history
from ingestion_assets.streams.cdc_rows import TableChanges, dead_letter_table, toast_lookup, version_of
from ingestion_assets.streams.postgres_table import PostgresTableStream, Target
from ingestion_assets.streams.target_types import fit_shape
from ingestion_assets.sync import Faults, checkpoint_first

log = logging.getLogger(__name__)
SLOT_RELEASE_SECONDS = 10.0
REACH_SECONDS = 120.0  # a chunk run waits this long for the log to reach its snapshot's WAL position


class CdcStore(Protocol):
    def latest(self) -> dict[str, Any] | None: ...

    def commit(self, lsn: int, **details: Any) -> None: ...


class CdcError(RuntimeError):
    """The log cannot be read safely; the message says why and what to do."""


@dataclass
class CdcOutcome:
    mode: str  # snapshot | changes | chunk
    lsn: int
    rows: dict[str, int] = field(default_factory=dict)  # per stream: rows (snapshot) or changes applied
    latency_ms: list[float] = field(default_factory=list)
    health: SlotHealth | None = None
    dead_letters: int = 0
    checkpoint: dict[str, Any] = field(default_factory=dict)  # details stored beside the log position

    def latency(self) -> dict[str, float]:
        if not self.latency_ms:
            return {}
        ordered = sorted(self.latency_ms)
        pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
        return {"p50": round(statistics.median(ordered), 1), "p95": round(pick(0.95), 1), "p99": round(pick(0.99), 1)}


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

    @property
    def slot(self) -> str:
        return self.source.cdc.slot or f"ingest_{self.source_name}"

    @property
    def publication(self) -> str:
        return self.source.cdc.publication or f"ingest_{self.source_name}"

    def url(self) -> str:
        return resolve(self.source.connection, self.settings, f"sources.{self.source_name}.connection")

    def tables(self) -> list[tuple[str, str]]:
        return [(s.spec.schema_name, s.spec.table_name) for s in self.streams]

    @property
    def history(self) -> bool:
        """History as key-range partitions beside the `live` one (else one snapshot copy in the first run)."""
        return self.source.cdc.history_chunk is not None

    def run(self, partition: str | None = None) -> CdcOutcome:
        """Apply the log (`live`, or no partition), or copy one history key range while applying it."""
        url = self.url()
        with reading_slot(url, self.slot, self.source.cdc.lock_wait_seconds):
            outcome = self._run(url, partition)
        outcome.checkpoint = {"snapshot_done": True, **({HISTORY: self._space} if self.history else {})}
        return outcome

    def _run(self, url: str, partition: str | None) -> CdcOutcome:
        state = self.store.latest()
        if state is None or not state.get("snapshot_done"):
            if not self.history:
                return self._snapshot(url)
            state = self._start_log(url)
        self._space = state.get(HISTORY)
        if self.history and self.add_partitions is not None:
            self.add_partitions(history_keys(state))
        lsn = parse_lsn(state["lsn"])
        gap = find_gap(url, self.slot, lsn)
        if gap is not None:
            if self.source.cdc.on_wal_gap == "resync":
                self._say("%s: %s; resyncing from a fresh snapshot (on_wal_gap: resync)", self.source_name, gap)
                drop_slot(url, self.slot)
                return self._snapshot(url)
            again = (
                f"Reset `live` (`ingest state reset {self.source_name}.STREAM --partition live` for each stream), "
                "run it, then backfill the history ranges again"
                if self.history
                else "Re-copy the source with `ingest state reset` on its streams (a fresh snapshot), or set "
                "cdc.on_wal_gap: resync"
            )
            raise CdcError(
                f"source {self.source_name}: the slot {self.slot} can no longer deliver the changes after the "
                f"checkpoint {format_lsn(lsn)} ({gap}). Rows changed in between would be missed. {again}"
            )
        if partition is None or partition == LIVE:
            return self._changes(url, lsn)
        if not self.history:
            raise CdcError(f"source {self.source_name} has no history partitions (cdc.history_chunk is unset)")
        return self._chunk(url, lsn, partition)

    def _start_log(self, url: str) -> dict[str, Any]:
        """History mode, first run: a new slot; the key space of the rows that exist now is the history."""
        self._preflight(url, expect_slot=False)
        with _existing_slot_dropped(url, self.slot), create_slot_with_snapshot(url, self.slot) as snap:
            lsn = snap.consistent_lsn
        chunk = self.source.cdc.history_chunk
        assert chunk is not None
        space = plan_history(url, self.streams, chunk)
        self._space = space
        self._commit(lsn)
        return {"lsn": format_lsn(lsn), "snapshot_done": True, HISTORY: space}

    def _chunk(self, url: str, lsn: int, partition: str) -> CdcOutcome:
        """One history key range: the log up to a fresh snapshot, then the range's rows as of it."""
        low, high = key_range(partition)
        with chunk_snapshot(url) as snap:
            fences = fences_for(snap, self.streams)
            outcome = self._changes(url, lsn, reach=snap.lsn, fences=fences)
            outcome.mode = "chunk"
            version = version_of(snap.lsn, 0) - 1  # above every change it sees, below every one it does not
            rules = self._rules()
            for stream in self.streams:
                table = (stream.spec.schema_name, stream.spec.table_name)
                if table in fences.truncated:
                    continue  # emptied after the snapshot: what it holds now came through the log
                copied = copy_as_of(url, stream, snap.name, version, rules, (low, high), fences, version_of(lsn, 0))
                outcome.rows[stream.name] = outcome.rows.get(stream.name, 0) + copied
        return outcome

    def _snapshot(self, url: str) -> CdcOutcome:
        """Every table under the exported snapshot of a new slot; the slot's changes start exactly after it."""
        self._preflight(url, expect_slot=False)
        with _existing_slot_dropped(url, self.slot), create_slot_with_snapshot(url, self.slot) as snap:
            version = version_of(snap.consistent_lsn, 0) - 1  # just below any change the slot will send
            outcome = CdcOutcome("snapshot", snap.consistent_lsn)
            for stream in self.streams:
                outcome.rows[stream.name] = copy_as_of(url, stream, snap.snapshot_name, version, self._rules())
        # Only once the block is left: a failure inside it drops the new slot, which a stored checkpoint
        # saying "snapshot done" would then point at (found by simulation seed 2013, cdc).
        self.store.commit(snap.consistent_lsn, snapshot_done=True, slot=self.slot)
        outcome.health = slot_health(url, self.slot)
        return outcome

    def _rules(self) -> CopyRules:
        faults = self.faults or Faults.from_env()
        return CopyRules(self.source.cdc.snapshot_slice_rows, self.run_id, faults, self.history)

    def _changes(self, url: str, lsn: int, reach: int | None = None, fences: Fences | None = None) -> CdcOutcome:
        """Batches of the log, each loaded, checkpointed, then acknowledged. With `reach` (a chunk's snapshot),
        go on until every transaction committed before that WAL position is applied, and show each to `fences`."""
        self._preflight(url, expect_slot=True)
        outcome = CdcOutcome("changes", lsn)
        faults = self.faults or Faults.from_env()
        unsafe = checkpoint_first()
        deadline = time.monotonic() + REACH_SECONDS
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
                max_seconds=self.source.cdc.max_seconds,
            )
            if batch.end_lsn <= outcome.lsn and not batch.transactions:
                if reach is None:
                    break
                self._wait_for_wal(reach, outcome.lsn, deadline)
                continue
            if fences is not None:
                fences.see(batch)
            if unsafe:  # never in production: checkpoint first, so a crash in the load loses the batch
                self._commit(batch.end_lsn)
            faults.hit("before_load", index)
            self._apply(url, batch, outcome)
            faults.hit("after_load", index)
            if not unsafe:
                self._commit(batch.end_lsn)
            faults.hit("after_checkpoint", index)
            acknowledge(url, self.slot, self.publication, batch.end_lsn)  # only behind a stored checkpoint
            outcome.lsn = batch.end_lsn
            index += 1
            if reach is None and (batch.caught_up or self.stop()):
                break
        outcome.health = slot_health(url, self.slot)
        return outcome

    def _commit(self, lsn: int) -> None:
        extra = {HISTORY: self._space} if self.history else {}
        self.store.commit(lsn, snapshot_done=True, slot=self.slot, **extra)

    def _wait_for_wal(self, reach: int, at: int, deadline: float) -> None:
        if time.monotonic() > deadline:
            raise CdcError(
                f"source {self.source_name}: the slot {self.slot} stayed at {format_lsn(at)} for "
                f"{REACH_SECONDS:.0f} s, short of the chunk snapshot's position {format_lsn(reach)}; "
                "nothing was loaded from the chunk, retry the partition"
            )
        time.sleep(0.2)

    def _apply(self, url: str, batch: ChangeBatch, outcome: CdcOutcome) -> None:
        by_table = {(s.spec.schema_name, s.spec.table_name): s for s in self.streams}
        pending: dict[str, TableChanges] = {}
        shapes = {s.name: s.discover() for s in self.streams}
        for change in batch.changes:
            stream = by_table.get((change.table.schema, change.table.table))
            if stream is None:
                continue
            if change.op.value == "truncate" and stream.spec.truncate == "refuse":
                raise CdcError(
                    f"stream {stream.qualified_name}: the source table was truncated at {format_lsn(change.commit_lsn)}"
                    " and the stream refuses truncates (it would empty the target). Set `truncate: apply` to "
                    "follow it, or re-copy with `ingest state reset`; nothing after it was applied"
                )
            changes = pending.setdefault(stream.name, TableChanges(shapes[stream.name], tuple(stream.spec.primary_key)))
            changes.add(change, toast_lookup(url, stream, shapes[stream.name]))
        for stream in self.streams:
            if stream.name in pending:
                self._load(stream, pending[stream.name], outcome)

    def _load(self, stream: PostgresTableStream, changes: TableChanges, outcome: CdcOutcome) -> None:
        loader = stream.loader(Target(stream.name, 1), None, guard=self.history)
        changes.shape = fit_shape(changes.shape, loader)
        if changes.truncated_at is not None:
            loader.delete_all()
        rows = changes.to_arrow(generation=1)
        dead = dead_letter_table(stream, changes, self.run_id)
        if rows is not None or dead is not None:
            loader.load(rows, dead_letters=dead)
        if stream.spec.deletes == "hard":
            loader.purge_deleted()
        now = dt.datetime.now(dt.UTC)
        outcome.latency_ms += [(now - t).total_seconds() * 1000 for t in changes.commit_times]
        outcome.rows[stream.name] = outcome.rows.get(stream.name, 0) + len(changes.rows)
        outcome.dead_letters += len(changes.bad)

    def _preflight(self, url: str, expect_slot: bool) -> None:
        ensure_publication(url, self.publication, self.tables())
        deadline = time.monotonic() + SLOT_RELEASE_SECONDS
        problems = check_cdc(url, self.slot, self.publication, self.tables(), expect_slot=expect_slot)
        # The walsender of the previous run (or of a crashed one) leaves the slot a moment after its client.
        while problems and all(p.transient for p in problems) and time.monotonic() < deadline:
            time.sleep(0.25)
            problems = check_cdc(url, self.slot, self.publication, self.tables(), expect_slot=expect_slot)
        if problems:
            raise CdcError(f"source {self.source_name} cannot capture changes: " + "; ".join(str(p) for p in problems))

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
