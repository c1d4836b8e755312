"""The seeded simulation of a live CDC run (`cdc.live_seconds`): the real LiveReader and apply_live holding one
replication session against a real PostgreSQL, with source changes (inserts, updates, deletes, primary-key
changes, the CDC simulation's DDL) made between batches while the session is held, crashes at the live loop's
fault points (before_load, after_load, after_checkpoint) and at lost or fatal checkpoint writes, a drain
request (the `stop` predicate SIGTERM sets) at seeded moments (between and within batches, and between the
ranges of the copy a live run makes first), and each crash resumed by a new live run from
the stored checkpoint.

Invariants: at every checkpoint the target is the source as of its log position (or as of the furthest batch
a crashed run loaded past it: a replay never takes a row back) and the slot is not acknowledged past it; a run never takes the log for a stream from a stored checkpoint
the slot is past (the changes in between are gone: a crash between an acknowledgement and its checkpoint); such
a stream must be copied again, which is by design when the other streams' runs acknowledge while its copy
waits to start (a column added); a drained run left nothing it read unstored; at the end, target == source
row by row (the stream added later too).

What keeps a seed replayable: the sim draws only when the loop asks for a batch (`next_batch`) and after a
copy's slices, and a batch ends on data, not on time: it reads until the last change the sim committed to a
published table that this session has not read yet arrives (each change's xid is noted; `batch_seconds` is
far above a read's need), or `max_changes`, or a drain after a drawn number of transactions. Not
deterministic: a batch cut short of the last change because the machine stalled past `batch_seconds` (the
next batch takes the rest), an empty batch checkpointed after IDLE_CHECKPOINT_SECONDS of background WAL, the
snapshot's catch-up (see cdc.py). `unsafe` plants the checkpoint-first order in the live loop only; the
tests also plant `early_ack` (each batch acknowledged as soon as it is read) and `unstored_drain` (a drain
that ends the run without the checkpoint of the batch it finished)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import ingestion_assets.streams.cdc.batches as batches_module
import ingestion_assets.streams.cdc.copy as copy_module
import ingestion_assets.streams.cdc.live as live_module
import ingestion_assets.streams.cdc.sync as sync_module
from ingestion_assets.sources.postgres.cdc import ChangeBatch, format_lsn, parse_lsn, slot_health
from ingestion_assets.sources.postgres.cdc.live import LiveReader
from ingestion_assets.streams.cdc import CdcSync
from ingestion_assets.streams.cdc.history import Fences
from ingestion_assets.streams.cdc.outcome import CdcOutcome
from ingestion_assets_tests.simulation.cdc import CdcSimulation, SimCdcStore
from ingestion_assets_tests.simulation.harness import SimFaults, SimulationFailure, replay_command

XID_SPACE = 2**32  # pgoutput's Begin carries the 32-bit xid
COPY_DRAIN = 0.1  # the chance of a drain after each slice of a copy
AT_REST_STEPS = 200  # a run at rest drains once it has read everything, or after this many batches


class LiveStore(SimCdcStore):
    """The CDC store; a run that reads it (a start, a resume after a crash) first checks the slot."""

    def __init__(self, rng: Any, rate: float, check: Any, on_read: Callable[[dict[str, dict[str, Any]]], None]) -> None:
        super().__init__(rng, rate, check)
        self.on_read = on_read

    def latest(self) -> dict[str, dict[str, Any] | None]:
        self.on_read(self.state)
        return super().latest()


class LiveCdcSimulation(CdcSimulation):
    fault_scale = 1 / 3  # three fault points a batch and many batches a run: at the base's rates few runs end

    def __init__(
        self,
        seed: int,
        source_url: str,
        home: Any,
        unsafe: bool = False,
        ddl: bool = True,
        early_ack: bool = False,
        unstored_drain: bool = False,
    ) -> None:
        super().__init__(seed, source_url, home, unsafe=False, history=False, ddl=ddl)
        self.unsafe_live = unsafe  # the planted bug: the live loop checkpoints before its load (the copy does not)
        self.mode = f"cdc live, {self.deletes} deletes"
        self.early_ack = early_ack  # the planted bug: acknowledge each batch as it is read, before its checkpoint
        self.unstored_drain = unstored_drain  # the planted bug: a drain ends the run before the batch's checkpoint
        self.store = LiveStore(self.rng, 0.05, self._check_checkpoint, self._check_resume)
        self.xids: list[tuple[int, int]] = []  # changes of published tables: (xid, WAL position after its commit)
        self.seen: dict[int, int] = {}  # xid -> its commit's end, from every batch any session read
        self.draining = False  # the stop predicate: what SIGTERM sets
        self._changing = False
        self._ddl_due: int | None = None  # the round whose DDL waits for the next batch of a held session
        self._steps = self._planned = 0
        self._read_end = 0  # the end of the last batch with transactions this run's session handed out
        self._behind: dict[str, int] = {}  # as a run starts: streams whose stored checkpoint the slot is past
        self._confirmed = 0
        self._loaded = 0  # the furthest log position whose batch a run loaded (crashed before its checkpoint or not)

    @property
    def replay(self) -> str:
        command = replay_command(self.seed, self.rounds, self.unsafe_live, kind="cdcl")
        planted = [name for name in ("early_ack", "unstored_drain") if getattr(self, name)]
        return command + (f" (with {', '.join(planted)}: a test's planted bug)" if planted else "")

    def _write_catalog(self) -> None:
        super()._write_catalog()
        assert self._cdc_options is not None
        if "live_seconds" not in self._cdc_options:
            # A run ends on a drain, never on its lifetime; a batch on data, never on batch_seconds (see above).
            self._cdc_options |= {"live_seconds": 3600, "batch_seconds": 5}
            super()._write_catalog()

    # --- the source --------------------------------------------------------------------------------
    def _change(self, statement: str, params: tuple[Any, ...]) -> None:
        with self._conn.cursor() as cur:  # one implicit transaction: the change and its xid
            cur.execute(f"{statement}; SELECT txid_current()", params)
            xid = int(cur.fetchone()[0]) % XID_SPACE
            cur.execute("SELECT pg_current_wal_insert_lsn()::text")  # at or past its commit's end
            self.xids.append((xid, parse_lsn(cur.fetchone()[0])))

    def _sql(self, statement: str, params: tuple[Any, ...] = ()) -> None:
        """A change of the stream added later, once its table is published, is noted like those of items."""
        if statement.startswith(f'INSERT INTO "{self.name}".more') and self._published("more"):
            self._change(statement, params)
        else:
            super()._sql(statement, params)

    def _published(self, table: str) -> bool:
        with self._conn.cursor() as cur:
            cur.execute(
                "SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s",
                (f"ingest_{self.name}", self.name, table),
            )
            return cur.fetchone() is not None

    def _source_ddl(self, round_: int) -> None:
        """Made at the round's first batch, while a live session is held."""
        if self._ddl_due is not None:
            super()._source_ddl(self._ddl_due)
        self._ddl_due = round_

    # --- syncing ---------------------------------------------------------------------------------
    def _sync(self, faults: SimFaults) -> CdcSync:
        faults.rate *= self.fault_scale
        sync = super()._sync(faults)
        sync.stop = lambda: self.draining
        if self.unstored_drain:
            commit = sync._commit

            def drained_commit(lsn: int, names: list[str] | None = None) -> None:
                if not (self.draining and self._read_end):
                    commit(lsn, names)

            sync._commit = drained_commit  # type: ignore[method-assign]
        real = sync.run

        def run(partition: str | None = None) -> CdcOutcome:
            self.draining, self._steps, self._read_end = False, 0, 0
            self._planned = self.source_rng.randint(1, 6)  # batches before the drain is asked for
            outcome = real(partition)
            self._check_drained()
            return outcome

        sync.run = run  # type: ignore[method-assign]
        return sync

    @contextlib.contextmanager
    def _changes_between_reads(self, changing: bool) -> Iterator[None]:
        """The base's changes between snapshot slices and log reads, and the live session's batches."""
        simulation, real_reader, real_first = self, live_module.LiveReader, live_module.checkpoint_first

        class SimLiveReader(LiveReader):
            def __init__(self, url: str, slot: str, publication: str, start_lsn: int, **kwargs: Any) -> None:
                super().__init__(url, slot, publication, start_lsn, **kwargs)
                self.start, self.read = start_lsn, set[int]()

            def next_batch(self, stop: Callable[[], bool] = lambda: False) -> ChangeBatch:
                target, drain_after = simulation._step(self)
                done = self._assembler.completed

                def enough() -> bool:
                    if drain_after is not None and len(done) >= drain_after:
                        simulation.draining = True
                    if stop():
                        return True
                    return target is None or any(tx.xid % XID_SPACE == target for tx in done)

                batch = super().next_batch(enough)
                simulation._note(batch.transactions, self.read)
                if batch.transactions:
                    simulation._read_end = batch.end_lsn
                    simulation.events.append(f"live batch: {len(batch.transactions)} transactions")
                    if simulation.early_ack:  # the planted bug: the slot moves before the checkpoint is stored
                        self.acknowledge(batch.end_lsn)
                return batch

        with super()._changes_between_reads(changing):
            self._changing, real_changes = changing, batches_module.read_changes

            def read_changes(*args: Any, **kwargs: Any) -> ChangeBatch:
                batch = real_changes(*args, **kwargs)
                simulation._note(batch.transactions, set())
                return batch

            real_slices = copy_module.table_slices

            def table_slices(*args: Any, **kwargs: Any) -> Iterator[Any]:
                for piece in real_slices(*args, **kwargs):  # a range of a copy: the drain ends the copy after it
                    yield piece
                    if (
                        changing
                        and COPY_DRAIN
                        and not simulation.draining
                        and simulation.source_rng.random() < COPY_DRAIN
                    ):
                        simulation.draining = True
                        simulation.events.append("drain: during a copy")

            real_stale = sync_module.recopy_stale

            def recopy_stale(sync: CdcSync, url: str, published: tuple[tuple[str, str], ...]) -> None:
                real_stale(sync, url, published)
                simulation._check_behind(sync)

            real_apply = batches_module.apply_batch

            def apply_batch(
                sync: CdcSync, url: str, batch: ChangeBatch, outcome: CdcOutcome, fences: Fences | None
            ) -> None:
                real_apply(sync, url, batch, outcome, fences)
                simulation._loaded = max(simulation._loaded, batch.end_lsn)

            sync_module.recopy_stale = recopy_stale
            batches_module.apply_batch = live_module.apply_batch = apply_batch
            live_module.LiveReader = SimLiveReader  # type: ignore[misc]
            batches_module.read_changes = read_changes
            copy_module.table_slices = table_slices
            live_module.checkpoint_first = lambda: self.unsafe_live
            try:
                yield
            finally:
                live_module.LiveReader, batches_module.read_changes = real_reader, real_changes  # type: ignore[misc]
                live_module.checkpoint_first, copy_module.table_slices = real_first, real_slices
                sync_module.recopy_stale = real_stale
                batches_module.apply_batch = live_module.apply_batch = real_apply

    def _note(self, transactions: Any, read: set[int]) -> None:
        for tx in transactions:
            self.seen[tx.xid % XID_SPACE] = tx.end_lsn
            read.add(tx.xid % XID_SPACE)

    def _step(self, reader: Any) -> tuple[int | None, int | None]:
        """The loop asks for a batch: the source may change (the round's DDL first), and a drain may be asked
        for after some of the transactions not read yet. Returns (the xid to read up to, drain after n)."""
        self._steps += 1
        rng = self.source_rng
        if self._changing:
            if self._ddl_due is not None:
                due, self._ddl_due = self._ddl_due, None
                super()._source_ddl(due)
            # Not past what a few batches read: with a small max_changes a backlog would outgrow every run.
            if rng.random() < 0.7 and len(self._pending(reader)) < 2 * reader.max_changes:
                self._mutate(rng.randint(1, 8))
        pending = self._pending(reader)
        drain: int | None = None
        if not self._changing:
            drain = 0 if not pending or self._steps > AT_REST_STEPS else None
        elif self._steps >= self._planned:
            drain = rng.randint(0, len(pending))
            self.events.append(f"drain: after {drain} of {len(pending)} transactions")
        return (pending[-1] if pending else None), drain

    def _pending(self, reader: Any) -> list[int]:
        """The sim's changes this session has still to read: committed after where it started and not read
        by it (a change read by an earlier session and stored behind that start is not sent again)."""
        return [
            xid
            for xid, stamp in self.xids
            if stamp > reader.start
            and xid not in reader.read
            and not (xid in self.seen and self.seen[xid] <= reader.start)
        ]

    # --- invariants ------------------------------------------------------------------------------
    def _check_resume(self, state: dict[str, dict[str, Any]]) -> None:
        """A run starts (first, or after a crash): note the streams whose stored checkpoint the slot is past."""
        self._behind = {}
        stored = {name: parse_lsn(c["lsn"]) for name, c in state.items() if c and c.get("lsn")}
        if stored:
            confirmed = slot_health(self.url, f"ingest_{self.name}").confirmed_flush_lsn or 0
            self._behind = {name: lsn for name, lsn in stored.items() if lsn < confirmed}
            self._confirmed = confirmed

    def _check_checkpoint(self, lsn: int) -> None:
        """The target is the source as of the checkpoint, or as of the furthest batch loaded: a live run's
        batches end on data its predecessor did not see (a drain, the changes made meanwhile), so a run that
        re-reads after a crash may store a checkpoint behind what the crashed run loaded. A replayed change
        never takes a row back (the newest version wins; a deleted row stays deleted)."""
        try:
            super()._check_checkpoint(lsn)
        except SimulationFailure as failure:
            if self._loaded <= lsn or "is not the source as of then" not in str(failure):
                raise
            try:
                super()._check_checkpoint(self._loaded)
            except SimulationFailure:
                raise failure from None

    def _check_behind(self, sync: CdcSync) -> None:
        """Before the run reads the log: a stream whose stored checkpoint the slot is past may not take the log
        from that checkpoint (the changes in between are gone from the slot); it must be copied again. That
        happens by design when the other streams' runs acknowledge while its copy waits to start (a column
        added); acknowledging a batch before its checkpoint is stored makes it for every stream."""
        wrong = {name: format_lsn(lsn) for name, lsn in self._behind.items() if sync._state.positions.get(name)}
        if wrong:
            raise SimulationFailure(
                f"seed {self.seed}: a run starts with the slot acknowledged at {format_lsn(self._confirmed)}, past "
                f"the stored checkpoints {wrong} of streams it would take the log for: the changes between are "
                f"lost to them; replay with `{self.replay}`"
            )

    def _check_drained(self) -> None:
        """A run that ended on its drain stored everything its session handed out."""
        behind = {
            name: c["lsn"]
            for name, c in self.store.state.items()
            if c.get("lsn") and parse_lsn(c["lsn"]) < self._read_end
        }
        if behind:
            raise SimulationFailure(
                f"seed {self.seed}: the drained run read up to {format_lsn(self._read_end)} but its checkpoints "
                f"stay at {behind}; replay with `{self.replay}`"
            )
