"""A PostgreSQL source in `mode: cdc`: the first run creates the slot and copies every table in checkpointed
key ranges beside the log, later runs apply the slot's changes in commit order. Each stream's checkpoint is the
log position whose changes are all committed in its target; the slot is acknowledged only after those
checkpoints are stored.
A stream without one (added to the catalog, reset, its target replaced, a column added) gets a fenced copy
while the log goes on for the others."""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ingestion_assets.catalog import Destination, PostgresSource
from ingestion_assets.partitions import LIVE
from ingestion_assets.references import postgres_url
from ingestion_assets.settings import Settings
from ingestion_assets.sources.postgres.cdc import DeclaredKey
from ingestion_assets.sources.postgres.cdc.marks import PUBLISHED
from ingestion_assets.sources.postgres.cdc.slot_lock import reading_slot
from ingestion_assets.streams.cdc.apply import LogLoads
from ingestion_assets.streams.cdc.batches import apply_log
from ingestion_assets.streams.cdc.copying import chunk, copy_streams, snapshot, start_log
from ingestion_assets.streams.cdc.history import HISTORY, history_keys
from ingestion_assets.streams.cdc.live import apply_live
from ingestion_assets.streams.cdc.names import refuse_unlandable
from ingestion_assets.streams.cdc.outcome import CdcError, CdcOutcome, LogBehind
from ingestion_assets.streams.cdc.paused import PAUSED, RECOPY
from ingestion_assets.streams.cdc.preflight import pause_unidentified, preflight
from ingestion_assets.streams.cdc.recopy import (
    recopy_republished,
    recopy_rewritten,
    recopy_stale,
    resync_at_gap,
    settle_streams,
)
from ingestion_assets.streams.cdc.schema import FILES, PARTITIONS, SCHEMA, StreamParts
from ingestion_assets.streams.cdc.state import COPY, CdcStore, SourceState
from ingestion_assets.streams.postgres_table import PostgresTableStream, Target
from ingestion_assets.streams.target_binding import TARGET
from ingestion_assets.sync import Faults

__all__ = ["CdcError", "CdcOutcome", "CdcStore", "CdcSync", "LogBehind"]

log = logging.getLogger(__name__)


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
    # Called holding the slot's lock, before anything is read or loaded (the targets counted as no run changes them)
    before_apply: Callable[[], None] | None = None
    _space: dict[str, int] | None = field(default=None, init=False)  # history mode: the key space, kept in checkpoints
    _state: SourceState = field(default_factory=lambda: SourceState({}), init=False)
    _streams: dict[str, StreamParts] = field(default_factory=dict, init=False)  # per stream: loader, shape, schema
    _loads: LogLoads = field(default_factory=LogLoads, init=False)  # what the run's batch loads share
    _applied: array[int] | None = field(default=None, init=False)  # copying: xids applied since the last snapshot
    refused: dict[str, str] = field(default_factory=dict, init=False)  # new streams whose key fails its check: why
    # The streams whose rows are being loaded (left set when the load fails: the failure names them)
    loading: list[str] = field(default_factory=list, init=False)
    # The publication and enum marks of each table as a live run found them (`recopy_republished`), and the
    # publication row versions the run's own ALTER PUBLICATION replaced
    marks: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict, init=False)
    own_versions: set[str] = field(default_factory=set, init=False)

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
        cdc = self.source.cdc
        live = cdc.live_seconds is not None and partition in (None, LIVE)  # the lock says who holds the slot
        with reading_slot(url, self.slot, cdc.lock_wait_seconds, self.run_id, live, lambda m: self._say("%s", m)):
            if self.before_apply is not None:
                self.before_apply()
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
        paused = pause_unidentified(self, url, stored)  # the other streams go on
        paused |= refuse_unlandable(self, url, stored)
        outcome = self._run_streams(url, partition, stored) if self.streams else CdcOutcome("changes", 0)
        outcome.paused = paused | self.refused
        return outcome

    def _run_streams(self, url: str, partition: str | None, stored: dict[str, Any]) -> CdcOutcome:
        self._state = SourceState({s.name: stored.get(s.name) for s in self.streams})
        for name, checkpoint in stored.items():
            if checkpoint and checkpoint.get(PAUSED) and name in self._state.positions:
                self._state.recopy(name, "its table passes its checks again after a pause")
                self._say("%s.%s: copying its table again: it passes its checks again", self.source_name, name)
            elif checkpoint and checkpoint.get(RECOPY) and name in self._state.positions:
                self._state.recopy(name, str(checkpoint[RECOPY]))
                self._say("%s.%s: copying its table again: %s", self.source_name, name, checkpoint[RECOPY])
        # A missing slot is no check's failure: `resync_at_gap` makes it again (on_wal_gap: resync) or says
        # which streams to re-copy (fail).
        live = partition is None or partition == LIVE
        published = preflight(self, url, marks=live)  # read-only checks, then the publication (and its marks)
        if live:
            settle_streams(self)
            recopy_stale(self, url, published)
            recopy_republished(self)
        if not self._state.started:
            if not self.history or self._state.reasons:
                # In history mode too when every stream lost its position for a reason (its publication dropped,
                # say): its ranges were copied already and run no more, so its tables are copied in full.
                self._space = self._stored_space()
                return self._live_after(url, snapshot(self, url))
            start_log(self, url)
        self._space = self._stored_space()
        if self.history and self.add_partitions is not None:
            self.add_partitions(history_keys({HISTORY: self._space}))
        lsn = self._state.low
        gap = resync_at_gap(self, url, lsn)
        if gap is not None:
            for name in self._state.positions:
                self._state.recopy(name, f"resync (on_wal_gap: resync): {gap}")
            return snapshot(self, url)
        if not live:
            if not self.history:
                raise CdcError(f"source {self.source_name} has no history partitions (cdc.history_chunk is unset)")
            return chunk(self, url, lsn, partition or "")
        outcome = CdcOutcome("changes", lsn)
        recopy_rewritten(self, url, outcome)
        if self._state.copying():
            copy_streams(self, url, outcome)
        if self.source.cdc.live_seconds is None:
            apply_log(self, url, outcome)
            return outcome
        return self._live_after(url, outcome)

    def _stored_space(self) -> dict[str, int] | None:
        """History mode: the key space the log's start planned, as the checkpoints keep it."""
        return next((c[HISTORY] for c in self._state.checkpoints.values() if c and c.get(HISTORY)), self._space)

    def _live_after(self, url: str, outcome: CdcOutcome) -> CdcOutcome:
        """With cdc.live_seconds the run stays up applying the log (after its snapshot, too)."""
        if self.source.cdc.live_seconds is not None and not self.stop():
            apply_live(self, url, outcome)
        return outcome

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
        extra: dict[str, Any] = {k: stored[k] for k in (SCHEMA, TARGET, PARTITIONS, FILES, PUBLISHED) if k in stored}
        table = next(((s.spec.schema_name, s.spec.table_name) for s in self.streams if s.name == name), None)
        if table in self.marks:  # a live run compared them with the stored ones (a history range run keeps those)
            extra[PUBLISHED] = self.marks[table]
        if self.history:
            extra[HISTORY] = self._space
        if name in self._state.copies:
            extra[COPY] = self._state.copies[name].stored()
        parts = self._streams.get(name)
        if parts is not None:
            extra |= parts.checkpoint_details()
        return {"snapshot_done": True, "slot": self.slot, **extra}

    def _parts(self, stream: PostgresTableStream) -> StreamParts:
        """A history range run settles no schema or binding: it takes the table as it is."""
        parts = self._streams.get(stream.name)
        if parts is None:
            parts = StreamParts(stream.loader(Target(stream.name, 1), None, guard=self.history), stream.discover())
            parts.loader.run_id = self.run_id
            self._streams[stream.name] = parts
        return parts

    def _say(self, message: str, *args: Any) -> None:
        (self.log or log).warning(message, *args)
