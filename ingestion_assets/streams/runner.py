"""One attempt on one stream partition: settle the schema, pick incremental, refresh or resume from the
stored state, run the checkpoint protocol, finish a refresh with an atomic swap, reconcile, and count
attempts that made no progress.

Dagster-free: state comes through a `StateStore`, so the assets and the simulation drive the same code.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from ingestion_assets.catalog import FilesStream, RestStream
from ingestion_assets.errors import classify
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.observe.commit_latency import MEASURED_TO
from ingestion_assets.partitions import LIVE
from ingestion_assets.state.model import DATA_COMMITTED_AT, Checkpoint
from ingestion_assets.streams.late_commits import PROBES, READERS
from ingestion_assets.streams.postgres_table import PostgresTableStream, RunOptions, Target
from ingestion_assets.streams.reconcile import (
    OWED,
    RECONCILED_AT,
    UNCHECKED,
    Reconciliation,
    carried_details,
    reconcile_run,
)
from ingestion_assets.streams.schema_step import (
    COLUMN_IDS,
    SchemaStep,
    added_over_values,
    added_with_values,
    apply_to_target,
    column_ids,
    made_again,
    retyped_values,
    settle_schema,
    unread_before,
)
from ingestion_assets.streams.table_leaves import GONE, LEAF_IDS, LEAVES
from ingestion_assets.streams.target_binding import TARGET, binding_details, settle_target
from ingestion_assets.sync import Faults, SyncResult

if TYPE_CHECKING:  # a step imports the modules of its own stream kind only (files and APIs: see `_schema_step`)
    from ingestion_assets.streams.files import FileSourceStream
    from ingestion_assets.streams.rest_api import RestApiStream
    from ingestion_assets.streams.rest_key_listing import KeyListingResult

    Stream: TypeAlias = PostgresTableStream | RestApiStream | FileSourceStream

ERROR_CHARS = 400
CARRIED: tuple[str, ...] = (
    "generation",
    "refresh",
    "refresh_requested",
    "complete",
    "schema",
    "schema_accepted",
    TARGET,
    PROBES,
    RECONCILED_AT,
)
CARRIED = (*CARRIED, MEASURED_TO)  # how far the stream's commit-to-target latency was measured
CARRIED = (*CARRIED, LEAVES)  # the leaf partitions a polled table stream has read (a failed run read no new one)
CARRIED = (*CARRIED, GONE)  # and those gone whose rows a full comparison has not yet found retired
CARRIED = (*CARRIED, LEAF_IDS)  # and what each of them was when it was read
CARRIED = (*CARRIED, READERS)  # transactions taken for readers: when one ends, the whole table is compared
CARRIED = (*CARRIED, OWED)  # a gap a comparison found and did not repair: runs compare in full until it is closed
CARRIED = (*CARRIED, UNCHECKED)  # where the rows loaded since the last check that ran begin


class StateStore(Protocol):
    def latest(self, partition: str | None) -> Checkpoint | None: ...

    def commit(self, partition: str | None, position: dict[str, Any] | None, **details: Any) -> None: ...


class NoProgress(RuntimeError):
    """Attempts in a row committed no slice: retrying again will not help."""

    transient = False


class StreamBusy(RuntimeError):
    """Another run is syncing the same stream partition right now."""

    transient = False


@dataclass
class PartitionOutcome:
    partition: str | None
    result: SyncResult
    generation: int
    mode: str  # incremental | refresh | refresh-retain
    drained: bool = False
    schema_changes: list[str] = field(default_factory=list)
    reconciliation: Reconciliation | None = None
    key_listing: KeyListingResult | None = None  # API streams: the periodic key listing, when one ran
    checkpoint: dict[str, Any] = field(default_factory=dict)  # the final checkpoint's details, as stored
    started_over: str | None = None  # why the run re-read from the start although it had a checkpoint


@dataclass
class _Sink:
    """Checkpoints each slice with the run's context (generation, refresh, schema) carried along."""

    store: StateStore
    partition: str | None
    details: dict[str, Any]
    position: dict[str, Any] | None
    commits: int = 0
    loader: Loader | None = None  # its binding to the target rides along with every checkpoint

    def commit(self, position: dict[str, Any] | None, slice_index: int, rows: int) -> None:
        details = {**self.details, **self.binding()}
        self.store.commit(self.partition, position, complete=False, slice=slice_index, rows=rows, **details)
        self.position = position
        self.commits += 1

    def binding(self) -> dict[str, Any]:
        return binding_details(self.loader) if self.loader is not None else {}


@dataclass
class PartitionJob:
    stream: Stream
    store: StateStore
    partition: str | None = None
    stop: Callable[[], bool] = field(default=lambda: False)
    faults: Faults | None = None
    log: logging.Logger | Any | None = None
    run_id: str = ""
    read_ahead: int = 1
    compare_whole: str | None = None  # why the run's check compares the whole table (or partition) whatever is due
    _carried: dict[str, Any] = field(default_factory=dict, init=False, repr=False)  # kept across its checkpoints

    def run(self) -> PartitionOutcome:
        with self._exclusive():
            state = self.store.latest(self.partition)
            details = dict(state.details) if state is not None else {}
            position = state.position if state is not None else None
            self._carried = carried_details(details)
            sink = _Sink(self.store, self.partition, {}, position)
            try:
                return self._attempt(details, position, sink)
            except Exception as exc:
                if state is not None and not sink.commits:  # nothing new committed: the data is as old as before
                    details[DATA_COMMITTED_AT] = state.data_committed_at.isoformat()
                self._record_failure(details, sink, exc)
                raise

    def _attempt(self, details: dict[str, Any], position: dict[str, Any] | None, sink: _Sink) -> PartitionOutcome:
        schema = self._schema_step(details)
        generation = int(details.get("generation", 0))  # 0: nothing loaded yet; the first load is generation 1
        refresh = details.get("refresh")  # a refresh in progress: {"mode", "generation"}
        if refresh is None:
            mode = details.get("refresh_requested") or (
                "remove" if self.stream.spec.write_disposition == "replace" else None
            )
            if mode is not None:
                refresh, position = {"mode": mode, "generation": generation + 1}, None
        if refresh is not None and refresh["mode"] == "remove":
            return self._refresh_by_swap(schema, int(refresh["generation"]), generation, position, sink, details)
        new_generation = int(refresh["generation"]) if refresh is not None else max(generation, 1)
        after = (
            position
            if refresh is not None
            else self.stream.resume_position(position, bool(details.get("complete", True)))
        )
        # the new schema only once the target has it (below); what the checks owe rides along with every checkpoint
        sink.details = {"generation": new_generation, **self._carried}
        if isinstance(self.stream, PostgresTableStream) and UNCHECKED not in self._carried:
            sink.details[UNCHECKED] = {"from": after}  # until this run's check has run
        if refresh is not None:
            sink.details["refresh"] = {"mode": "retain", "generation": new_generation}
        target = Target(self.stream.name, new_generation)
        loader = self.stream.loader(target, self.partition, schema.plan)
        ids = column_ids(self.stream) if isinstance(self.stream, PostgresTableStream) else None
        if ids is not None:  # every checkpoint of the run, its failure record too
            sink.details[COLUMN_IDS] = self._carried[COLUMN_IDS] = ids
        faults = self.faults or Faults.from_env()
        with loader.held():  # the target's steps before the read, under one writer lock (short: no read inside)
            after, started_over = self._settle_target(loader, details, after, new_generation)
            # a window without a position (it had no rows) reads from its start anyway, but the other windows' rows
            # written under the old schema are still owed, and only this run can say so
            if started_over is None and (after is not None or self._window_with_schema(details)):
                retyped = [c.column for c in schema.applied if c.old is not None and c.new is not None]
                remade = made_again(details.get(COLUMN_IDS), ids, retyped) if ids is not None else []
                read = ids is not None and "last_error" not in details  # a failure's record may mix old and new
                unread = unread_before(details.get(COLUMN_IDS), ids, schema) if read and ids is not None else []
                started_over = self._reread_for_schema(schema, remade, loader, unread)
                after = None if started_over is not None else after
            if started_over is not None:  # a failure before the re-read's first checkpoint must not keep the old
                sink.position = None  # position beside the new schema (the next run would read on, past old values)
            sink.loader = loader
            faults.hit("before_migration", 0)
            apply_to_target(schema, loader)
        sink.details["schema"] = schema.stored  # a failed migration left the old one stored: the next run retries
        faults.hit("after_migration", 0)
        floor = None if started_over or after is None else position  # the checkpoint holds here at least
        result = self._read(after, target, sink, loader, schema, details, floor)
        mode = "refresh-retain" if refresh is not None else "incremental"
        outcome = self._finish(result, new_generation, mode, schema, loader, binding=binding_details(loader))
        outcome.started_over = started_over
        return outcome

    def _window_with_schema(self, details: dict[str, Any]) -> bool:
        """A partition (not `live`) that ran before under a stored schema."""
        return self.partition not in (None, LIVE) and details.get("schema") is not None

    def _reread_for_schema(
        self, schema: SchemaStep, remade: list[str], loader: Loader, unread: list[str]
    ) -> str | None:
        """Why this run reads every row again for a schema change that altered rows without moving their
        cursor, or that the target holds other values for (None: it reads on from its checkpoint)."""
        if not isinstance(self.stream, PostgresTableStream):
            return None
        filled = added_with_values(self.stream, schema)
        held = [name for name in added_over_values(loader, schema) if name not in filled]
        unread = [name for name in unread if name not in filled and name not in held]
        retyped = retyped_values(schema)
        said = []
        if remade:
            said.append(
                f"{', '.join(remade)} changed in place (dropped and made again, renamed, or altered: a restore, "
                "values reset, or rewritten)"
            )
        if filled:
            said.append(
                f"column(s) {', '.join(filled)} added with values in the existing rows (a default, generated or "
                "identity column)"
            )
        if held:
            said.append(
                f"column(s) {', '.join(held)} added again over a target column that still holds values (dropped "
                "earlier and kept there), where the source holds NULL in every existing row"
            )
        if unread:
            said.append(
                f"column(s) {', '.join(unread)} read from now on although the table had them at the last run (not "
                "read then: schema_policy ignore), so rows read since hold no value there"
            )
        if retyped:
            said.append(
                f"column(s) {', '.join(retyped)} changed type, which rewrote the values of the existing rows "
                "without moving their cursor"
            )
        why = f"{'; '.join(said)}: every row is read again, merged by key" if said else None
        if why is not None and self.partition not in (None, LIVE):
            why += (
                f" (this partition's rows; every other partition of {self.stream.qualified_name} reads its rows "
                "again only when it runs: run them all, e.g. with --partition-range FIRST...LAST)"
            )
        if why is not None and self.log is not None:
            self.log.warning("%s: re-reading from the start: %s", self.stream.qualified_name, why)
        return why

    def _schema_step(self, details: dict[str, Any]) -> SchemaStep:
        if isinstance(self.stream, PostgresTableStream):
            return settle_schema(self.stream, details)
        if isinstance(self.stream.spec, FilesStream):  # learnt file by file
            from ingestion_assets.streams.files import FileSourceStream
            from ingestion_assets.streams.files_schema import files_schema_step

            assert isinstance(self.stream, FileSourceStream)
            return files_schema_step(self.stream, details)
        from ingestion_assets.streams.rest_api import RestApiStream
        from ingestion_assets.streams.rest_schema import api_schema_step

        assert isinstance(self.stream, RestApiStream)
        return api_schema_step(self.stream, details)  # learnt from the records, slice by slice

    def _settle_target(
        self, loader: Loader, details: dict[str, Any], after: dict[str, Any] | None, generation: int
    ) -> tuple[dict[str, Any] | None, str | None]:
        """Continue from `after` only if the target holds what the checkpoint describes; else start over."""
        settled = settle_target(loader, self.partition, details, after, generation)
        if settled.reason is not None and self.log is not None:
            self.log.warning(
                "%s%s: re-reading from the start: %s",
                self.stream.qualified_name,
                _partition_text(self.partition),
                settled.reason,
            )
        return settled.position, settled.reason

    def _refresh_by_swap(
        self,
        schema: SchemaStep,
        new_generation: int,
        live_generation: int,
        after: dict[str, Any] | None,
        sink: _Sink,
        stored: dict[str, Any],
    ) -> PartitionOutcome:
        """Load everything into a shadow table; swap it in only once the read completed."""
        shadow = f"{self.stream.name}_refresh_g{new_generation}"
        target = Target(shadow, new_generation, stream_table=self.stream.name)
        sink.details = {
            **self._carried,
            "generation": live_generation,
            "refresh": {"mode": "remove", "generation": new_generation},
            "schema": schema.stored,
        }
        loader = self.stream.loader(target, self.partition, schema.plan)
        # its binding must be recorded under the stream's name, the table the shadow becomes: else the next run finds
        # the old binding there and reads the whole stream again
        assert loader.stream_name == self.stream.name, f"{type(self.stream).__name__}.loader ignores stream_table"
        if (
            after is not None
            and loader.max_generation(shadow) is None
            and loader.max_generation(self.stream.name) == new_generation
        ):
            # The swap happened, then the process died before the checkpoint said so: record it, then do what
            # this run is for from there (a `replace` stream refreshes again, a one-off refresh goes on
            # incrementally), so the run reflects the source as of now, not as of the crashed run.
            done = {"generation": new_generation, "complete": True, "schema": schema.stored}
            done.update({TARGET: stored[TARGET]} if TARGET in stored else {})
            self.store.commit(self.partition, after, **done)
            return self._attempt(done, after, _Sink(self.store, self.partition, {}, after))
        after, started_over = self._settle_target(loader, stored, after, new_generation)
        sink.loader = loader
        result = self._read(after, target, sink, loader, schema, stored, after)
        if self.stop():
            return PartitionOutcome(self.partition, result, live_generation, "refresh", drained=True)
        (self.faults or Faults.from_env()).hit("before_swap", 0)
        loader.swap_in(shadow, self.stream.name, generation=new_generation)
        (self.faults or Faults.from_env()).hit("after_swap", 0)
        live = self.stream.loader(Target(self.stream.name, new_generation), self.partition, schema.plan)
        outcome = self._finish(
            result, new_generation, "refresh", schema, live, full=True, binding=binding_details(loader)
        )
        outcome.started_over = started_over
        return outcome

    def _read(
        self,
        after: dict[str, Any] | None,
        target: Target,
        sink: _Sink,
        loader: Loader,
        schema: SchemaStep,
        stored: dict[str, Any],
        floor: dict[str, Any] | None,
    ) -> SyncResult:
        options = RunOptions(
            target=target,
            partition=self.partition,
            run_id=self.run_id,
            stop=self.stop,
            faults=self.faults,
            log=self.log,
            loader=loader,
            plan=schema.plan,
            read_ahead=self.read_ahead,
            stored=stored,
            floor=floor,
            schema=schema,
        )
        return self.stream.run(after, sink, options)

    def _finish(
        self,
        result: SyncResult,
        generation: int,
        mode: str,
        schema: SchemaStep,
        loader: Loader,
        full: bool = False,
        binding: dict[str, Any] | None = None,
    ) -> PartitionOutcome:
        drained = self.stop()
        outcome = PartitionOutcome(self.partition, result, generation, mode, drained, schema.describe())
        if drained:
            return outcome
        outcome.checkpoint = {
            "complete": True,
            "rows": result.rows,
            "slices": result.slices,
            "generation": generation,
            "schema": schema.stored,
            **(binding or {}),
            **result.details,
            **self._carried,
        }
        checks = isinstance(self.stream, PostgresTableStream) and schema.plan is not None
        if checks and result.slices and UNCHECKED not in outcome.checkpoint:  # this run's loads, until its check
            outcome.checkpoint[UNCHECKED] = {"from": result.started_from}
        self.store.commit(self.partition, result.position, **outcome.checkpoint)
        if isinstance(self.stream.spec, RestStream):  # behind the checkpoint: every key in the target was read
            from ingestion_assets.streams.rest_api import RestApiStream

            assert isinstance(self.stream, RestApiStream)
            outcome.key_listing = self.stream.retire_unlisted(loader)
        if checks:
            assert isinstance(self.stream, PostgresTableStream) and schema.plan is not None
            (self.faults or Faults.from_env()).hit("before_check", 0)
            check = reconcile_run(
                self.stream,
                schema.plan,
                loader,
                self.partition,
                result,
                self._carried,
                self._compare_whole_because(result, refreshed=full),
                generation,
                self.run_id,
            )
            outcome.reconciliation = check.figures
            settled = _gone_settled(check.figures) and GONE in outcome.checkpoint
            if settled:  # no row of a partition gone is left in the target: later runs compare as usual again
                del outcome.checkpoint[GONE]
            # when the last full comparison ran (later runs know when the next one is due), and what it left owed
            for name, value in check.carried.items():
                if value is None:
                    outcome.checkpoint.pop(name, None)
                else:
                    outcome.checkpoint[name] = value
            checked = outcome.checkpoint.pop(UNCHECKED, None) is not None  # what it found is owed, if anything
            if check.carried or settled or checked:
                self.store.commit(self.partition, result.position, **outcome.checkpoint)
        return outcome

    def _compare_whole_because(self, result: SyncResult, refreshed: bool) -> list[str]:
        """Why this run's check compares the whole table (or partition) whatever is due: rows moved without a
        cursor to show it. Said in the check's metadata."""
        reasons = ["a refresh read the table again"] if refreshed else []
        gone = result.details.get(GONE)
        if gone:
            reasons.append(f"source partition(s) detached, dropped or made again: {', '.join(map(str, gone[:3]))}")
        return [*reasons, *(why for why in (result.compare_whole, self.compare_whole) if why is not None)]

    def _record_failure(self, details: dict[str, Any], sink: _Sink, exc: Exception) -> None:
        """Keep the checkpoint, note the failure; several failed attempts without a commit in a row stop."""
        carried = {k: v for k, v in details.items() if k in CARRIED}
        if not sink.commits and DATA_COMMITTED_AT in details:  # the data is still as old as the last commit
            carried[DATA_COMMITTED_AT] = details[DATA_COMMITTED_AT]
        carried.update(sink.details)
        carried.update(sink.binding())
        failures = 0 if sink.commits else _attempts_of_this_run(details, self.run_id) + 1
        error = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
        self.store.commit(
            self.partition,
            sink.position,
            **{**carried, "complete": False},
            no_progress={"run": self.run_id, "attempts": failures},
            last_error=error,
        )
        limit = self.stream.spec.retries.max_no_progress
        if failures >= limit and classify(exc).transient:  # a permanent error fails at once anyway
            knob = "slice_rows" if isinstance(self.stream, PostgresTableStream) else "pages_per_slice"
            raise NoProgress(
                f"stream {self.stream.qualified_name}{_partition_text(self.partition)} made no progress in "
                f"{failures} attempts in a row (no slice committed); last error: {error}. If every attempt "
                f"fails the same way, the slice may be too large to read and load before the failure hits "
                f"(lower `{knob}`), or the source is not answering (check it with `ingest check`)"
            ) from exc

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Two runs of one partition would race their checkpoints: the second stops at once."""
        locks = self.stream.settings.home / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        name = f"{self.stream.source_name}__{self.stream.name}__{self.partition or '_'}".replace("/", "_")
        path = Path(locks / f"{name}.lock")
        with path.open("a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                raise StreamBusy(
                    f"stream {self.stream.qualified_name}{_partition_text(self.partition)} is being synced by "
                    f"another run (process {holder}); this run leaves it alone"
                ) from exc
            handle.seek(0)
            handle.truncate()
            handle.write(str(os.getpid()))
            handle.flush()
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _gone_settled(figures: Reconciliation | None) -> bool:
    """A full comparison finished and left no row only in the target (deleted, flagged, or none there)."""
    if figures is None or figures.scope != "full" or figures.skipped or figures.error:
        return False
    return figures.deletes_pending == 0


def _attempts_of_this_run(details: dict[str, Any], run_id: str) -> int:
    """Attempts without progress of this run's retry sequence; another run's failures do not count."""
    earlier = details.get("no_progress")
    if isinstance(earlier, dict) and earlier.get("run") == run_id:
        return int(earlier.get("attempts", 0))
    return 0


def _partition_text(partition: str | None) -> str:
    return "" if partition is None else f" partition {partition}"
