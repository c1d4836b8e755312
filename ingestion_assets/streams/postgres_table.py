"""A PostgreSQL table stream: keyset read from its checkpoint, merge into the target, checkpoint per slice."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ingestion_assets.catalog import Destination, PostgresSource, PostgresStream
from ingestion_assets.loading.dead_letters import dead_letter_limit, split_bad_rows
from ingestion_assets.loading.metadata_columns import with_metadata
from ingestion_assets.loading.pipeline import Loader, TargetTable, pipeline_name
from ingestion_assets.loading.targets import make_loader
from ingestion_assets.observe.commit_latency import CommitLatency
from ingestion_assets.partitions import UnknownPartition, window_for
from ingestion_assets.references import postgres_url
from ingestion_assets.settings import Settings
from ingestion_assets.sources.postgres import plan_table_read, table_slices
from ingestion_assets.sources.postgres.cursor_order import unordered_cursor_columns
from ingestion_assets.sources.postgres.introspect import TableShape, discover_table, type_hints
from ingestion_assets.sources.postgres.query import ReadPlan, Window
from ingestion_assets.sources.postgres.reader import connect
from ingestion_assets.sources.postgres.unique_key import repeated_key_error, repeated_keys
from ingestion_assets.sources.slices import Slice
from ingestion_assets.streams.late_commits import PROBES, READERS, guard_read
from ingestion_assets.streams.outside_windows import OUTSIDE, count_outside, outside_text
from ingestion_assets.streams.table_leaves import (
    GONE,
    LEAF_IDS,
    LEAVES,
    UNSETTLED,
    LeafChanges,
    compare,
    late_writers,
    leaf_names,
    leaf_plan,
    pinned_snapshot,
)
from ingestion_assets.sync import CheckpointSink, Faults, SliceOutcome, SyncResult, run_slices

_LEAF_READS = 3  # a new leaf read whole at most this often in one run while writers in flight keep adding to it


class StreamError(RuntimeError):
    """A stream cannot run; the message starts with the stream's name."""

    transient = False


@dataclass(frozen=True)
class Target:
    """The table a run writes and the generation its rows carry."""

    table: str
    generation: int
    stream_table: str | None = None  # set when `table` is a refresh's shadow of this stream table


@dataclass
class RunOptions:
    """How one read runs: where it writes, what it skips, how it is stopped or failed on purpose."""

    target: Target
    partition: str | None = None
    run_id: str = ""
    skip_columns: frozenset[str] = frozenset()
    stop: Callable[[], bool] | None = None
    faults: Faults | None = None
    log: logging.Logger | Any | None = None
    loader: Loader | None = None
    plan: ReadPlan | None = field(default=None, repr=False)
    read_ahead: int = 1  # slices read ahead in a thread; 0 keeps everything in one thread (the simulation)
    stored: dict[str, Any] = field(default_factory=dict)  # the checkpoint's details the run started from
    floor: dict[str, Any] | None = None  # the stored checkpoint: the run's checkpoints never fall below it
    schema: Any = None  # API streams: the run's schema step (streams/rest_schema.py), checked slice by slice


@dataclass(frozen=True)
class PostgresTableStream:
    settings: Settings
    destination: Destination
    source_name: str
    source: PostgresSource
    name: str
    spec: PostgresStream

    @property
    def qualified_name(self) -> str:
        return f"{self.source_name}.{self.name}"

    @property
    def key_columns(self) -> set[str]:
        """Columns the stream cannot lose: primary key, cursor and partition column."""
        return set(self.spec.primary_key) | set(self.spec.cursor) | {c for c in [self.spec.partition_column] if c}

    def resume_position(self, position: dict[str, Any] | None, complete: bool) -> dict[str, Any] | None:
        """Where the next run starts: after the checkpoint; a cursor-less stream re-reads once complete."""
        if not self.spec.cursor and complete:
            return None
        if position is not None and self.spec.lookback_seconds and len(self.spec.cursor) == 1:
            return _looked_back(position, self.spec.cursor[0], self.spec.lookback_seconds)
        return position

    def loader(
        self,
        target: Target,
        partition: str | None,
        plan: ReadPlan | None = None,
        guard: bool = False,
        source_wins: bool = False,
    ) -> Loader:
        """`guard`: keep the newest version even if the stream has no partitions (another writer shares it);
        `source_wins`: never (a person asked for the source's version over a newer one the target holds)."""
        plan = plan or self.plan()
        return make_loader(
            settings=self.settings,
            destination=self.destination,
            target=TargetTable(
                dataset=self.source_name,
                table=target.table,
                primary_key=tuple(self.spec.primary_key),
                write_disposition="merge" if target.stream_table else self.spec.write_disposition,
                type_hints=type_hints(plan.shape),
                source_columns=tuple(c.name for c in plan.shape.columns),
                numeric_position=len(self.spec.cursor) == 1 and bool(self.numeric_cursor(plan)),
            ),
            pipeline_name=pipeline_name(self.source_name, target.table, partition),
            guard_versions=not source_wins and (guard or self.spec.partitions is not None),
            stream_table=target.stream_table,
        )

    def numeric_cursor(self, plan: ReadPlan) -> tuple[str, ...]:
        """The cursor columns holding a numeric's text (a numeric without limits): versions compare their values.
        A plan without the source's columns (`ingest dlq list`/`discard` need no source) compares no version."""
        columns = {column.name: column for column in plan.shape.columns}
        return tuple(name for name in self.spec.cursor if name in columns and columns[name].is_numeric_text)

    def source_url(self) -> str:
        return postgres_url(
            self.source.connection, self.source.tls, self.settings, f"sources.{self.source_name}.connection"
        )

    def discover(self) -> TableShape:
        """The table's columns as they are now, without checking the catalog's names against them."""
        conn = connect(self.source_url(), "ingest-discover")
        try:
            return discover_table(conn, self.spec.schema_name, self.spec.table_name, self.destination.landing)
        except LookupError as exc:
            raise StreamError(f"stream {self.qualified_name}: {exc}") from exc
        finally:
            conn.close()

    def _cursor_ordered_alike(self) -> None:
        """Partitions keep a row's newest version by comparing cursor values in the target: refuse a cursor whose
        order there differs from the source's (an enum, text in a linguistic collation)."""
        conn = connect(self.source_url(), "ingest-cursor-check")
        try:
            spec = self.spec
            unordered = unordered_cursor_columns(conn, spec.schema_name, spec.table_name, tuple(spec.cursor))
        finally:
            conn.close()
        if unordered:
            raise StreamError(
                f"stream {self.qualified_name}: cursor {', '.join(unordered)} does not compare in the target as in "
                "the source, and a partitioned stream keeps each row's newest version by comparing cursor values "
                "in the target: a newer version would lose to an older one. Use a cursor of a number, date or "
                'timestamp type (or text in collation "C"), or leave the stream unpartitioned; nothing was read'
            )

    def _key_unique(self, plan: ReadPlan, window: Window | None) -> None:
        within = plan.window_conditions(window) if window is not None else []
        conn = connect(self.source_url(), "ingest-key-check")
        try:
            key = tuple(self.spec.primary_key)
            repeated, count = repeated_keys(conn, self.spec.schema_name, self.spec.table_name, key, within)
        finally:
            conn.close()
        if repeated:
            raise StreamError(repeated_key_error(self.qualified_name, key, repeated, count))

    def plan(self, skip_columns: frozenset[str] = frozenset()) -> ReadPlan:
        try:
            return plan_table_read(
                self.source_url(),
                self.spec.schema_name,
                self.spec.table_name,
                tuple(self.spec.cursor),
                tuple(self.spec.primary_key),
                max_value_bytes=self.spec.dead_letters.max_value_bytes,
                skip_columns=skip_columns,
                destination=self.destination.landing,
            )
        except LookupError as exc:
            raise StreamError(f"stream {self.qualified_name}: {exc}") from exc

    def run(self, after: dict[str, Any] | None, sink: CheckpointSink, options: RunOptions) -> SyncResult:
        """Read the partition's window after `after` and load it into the target, checkpointing each slice."""
        try:
            window = window_for(self.spec, options.partition)
        except UnknownPartition as exc:
            raise StreamError(f"stream {self.qualified_name}: {exc}") from exc
        plan = options.plan or self.plan(options.skip_columns)
        if self.spec.partitions is not None:
            self._cursor_ordered_alike()
        if after is None and self.spec.write_disposition == "merge" and self.spec.primary_key:
            self._key_unique(plan, window)  # a first full read (of the partition's window): before anything loads
        outside = count_outside(self, plan, options.partition, options.stored) if window is not None else None
        loader = options.loader or self.loader(options.target, options.partition, plan)
        loader.run_id = options.run_id
        if after is None and window is None and loader.use_initial_load_path() and options.log is not None:
            options.log.info("%s: empty target, first full read: loading slices by append", self.qualified_name)
        latency = CommitLatency.for_stream(self.spec.cursor[0] if len(self.spec.cursor) == 1 else None, options.stored)

        def load(piece: Slice) -> SliceOutcome:
            generation, partition = options.target.generation, options.partition
            rows, outcome = self.load_piece(piece, loader, plan, generation, partition, options.run_id)
            latency.observe(rows, dt.datetime.now(dt.UTC))  # committed: the load returned
            return outcome

        guard = None
        if self.spec.cursor and self.spec.late_commits.enabled:
            guard = guard_read(self.source_url(), plan, self.spec, options.stored, options.floor, self.qualified_name)
            if guard.note is not None and options.log is not None:
                options.log.warning(guard.note)
        settled = guard.settled if guard is not None else None
        leaves = self._leaf_changes(options.stored) if self.spec.cursor else None
        faults = options.faults or Faults.from_env()
        caught_up = self._read_new_leaves(leaves, plan, after, window, load, faults) if leaves is not None else None
        if leaves is not None:  # only now that a new leaf's rows are loaded does a checkpoint record it as read
            kept = getattr(sink, "details", None)
            if isinstance(kept, dict):
                kept[LEAVES], kept[LEAF_IDS] = leaves.now, leaves.ids
        slices = table_slices(
            self.source_url(), plan, after, self.spec.slice_rows, self.qualified_name, window, settled=settled
        )
        result = run_slices(
            slices,
            load,
            sink,
            started_from=after,
            faults=faults,
            log=options.log,
            stop=options.stop,
            after_commit=lambda result: dead_letter_limit(self.qualified_name, self.spec.dead_letters, result),
            read_ahead=options.read_ahead,
            prepare=lambda: loader.prepare_ahead(self._empty(plan)),
        )
        latency.finish(result.details, result.figures)
        if guard is not None:
            result.details[PROBES], result.note = guard.probes, guard.note
            result.details[READERS], result.compare_whole = guard.readers, guard.compare_whole
            if guard.compare_whole is not None and options.log is not None:
                options.log.warning(guard.compare_whole)
        if leaves is not None:
            self._settle_leaves(result, leaves, caught_up, options.log, options.stored.get(GONE))
        if outside is not None:  # rows no window reads: said by every run that counted them, kept for `ingest status`
            result.details[OUTSIDE] = outside
            said = outside_text(self.qualified_name, outside)
            if said is not None and options.log is not None:
                options.log.warning(said)
        if result.slices == 0:
            loader.create_if_missing(self._empty(plan))
        return result

    def load_piece(
        self, piece: Slice, loader: Loader, plan: ReadPlan, generation: int, partition: str | None, run_id: str
    ) -> tuple[pa.Table, SliceOutcome]:
        """One slice as every read loads it (a run's, a reconciliation's repair): bad values parked or nulled,
        metadata columns added, merged; returns the rows as read and what the load did."""
        ordering = [c.name for c in plan.ordering]
        split = split_bad_rows(
            piece.table,
            self.name,
            partition,
            run_id,
            self.spec.primary_key,
            ordering,
            self.spec.dead_letters.on_bad_value,
        )
        now = dt.datetime.now(dt.UTC)
        numbers = self.numeric_cursor(plan)
        rows = with_metadata(split.rows, self.spec.cursor, now, generation, meta=split.meta, numbers=numbers)
        loaded = loader.load(rows, dead_letters=split.dead)
        parked = split.dead_count + loader.take_parked()
        return split.rows, SliceOutcome(loaded=loaded, dead_letters=parked, nulled=split.nulled)

    def _leaf_changes(self, stored: dict[str, Any]) -> LeafChanges:
        found = leaf_names(self.source_url(), self.spec.schema_name, self.spec.table_name)
        changes = compare(stored, {name: ident for name, (_, _, ident) in found.items()})
        return dataclasses.replace(changes, names={name: (s, t) for name, (s, t, _) in found.items()})

    def _read_new_leaves(
        self,
        leaves: LeafChanges,
        plan: ReadPlan,
        after: dict[str, Any] | None,
        window: Window | None,
        load: Callable[[Slice], SliceOutcome],
        faults: Faults,
    ) -> SliceOutcome | None:
        """Load every row of the leaves the checkpoint has not read (attached with rows older than the checkpoint's
        cursor, which the keyset read would pass over), merged like any slice. A first read reads them anyway.

        Each leaf is read under a snapshot whose in-flight writers are known (a load into a partition just
        attached, still open): once they end, a leaf they wrote rows behind the checkpoint into is read whole
        again; one still open after `late_commits.wait_seconds` leaves the leaf to be read whole again by the next
        run (rows past the checkpoint are the keyset read's, as in any leaf)."""
        if after is None or not leaves.new:
            return None
        total = SliceOutcome(loaded=0, dead_letters=0, nulled=0)
        late_commits = self.spec.late_commits
        url, name_of_stream = self.source_url(), self.qualified_name
        for name in leaves.new:
            schema, table = leaves.names[name]
            whole = leaf_plan(plan, schema, table)
            settled = False
            for _ in range(_LEAF_READS):
                with pinned_snapshot(url) as (snapshot, in_flight):
                    for piece in table_slices(
                        url, whole, None, self.spec.slice_rows, name_of_stream, window, snapshot=snapshot
                    ):
                        done = load(piece)
                        faults.hit("after_partition_load", piece.index)
                        total = SliceOutcome(
                            loaded=total.loaded + done.loaded,
                            dead_letters=total.dead_letters + done.dead_letters,
                            nulled=total.nulled + done.nulled,
                        )
                watched = in_flight if late_commits.enabled else []
                late = late_writers(url, whole, after, watched, late_commits.wait_seconds)
                settled = not late.still_open and not late.rows
                if settled or late.still_open:
                    break
            if not settled and name in leaves.ids:
                leaves.ids[name] += UNSETTLED
        return total

    def _settle_leaves(
        self, result: SyncResult, leaves: LeafChanges, caught_up: SliceOutcome | None, log: Any, pending: Any
    ) -> None:
        """Keep the leaves read in the final checkpoint; say what moved in the run's log and metadata. Leaves gone
        stay pending (each run compares the whole table) until a full comparison finds no row of theirs left."""
        result.details[LEAVES], result.details[LEAF_IDS] = leaves.now, leaves.ids
        if caught_up is not None:
            result.loaded += caught_up.loaded
            result.dead_letters += caught_up.dead_letters
        earlier = [name for name in pending if name not in leaves.gone] if isinstance(pending, list) else []
        if leaves.gone or leaves.remade or earlier:
            result.details[GONE] = sorted({*leaves.gone, *leaves.remade, *earlier})
        note = leaves.note(self.qualified_name, caught_up.loaded if caught_up is not None else 0)
        if earlier:
            still = (
                f"stream {self.qualified_name}: rows of partition(s) {', '.join(earlier)} (detached or dropped "
                "earlier) may still be in the target: the whole table is compared each run until they are deleted "
                f"(`ingest reconcile {self.qualified_name} --apply-deletes`, or reconcile.deletes)"
            )
            note = f"{note}; {still}" if note else still
        if note is None:
            return
        result.partitions_moved = note
        if log is not None:
            log.warning(note)

    def _empty(self, plan: ReadPlan) -> pa.Table:
        """The target's shape without rows: what a slice of the table becomes, its metadata columns added."""
        empty = plan.shape.arrow_schema.empty_table()
        return with_metadata(empty, self.spec.cursor, dt.datetime.now(dt.UTC), 0, numbers=self.numeric_cursor(plan))


def _looked_back(position: dict[str, Any], cursor: str, seconds: float) -> dict[str, Any]:
    """Start `seconds` before the checkpoint's cursor, at the lowest key: rows since are read again."""
    value = position.get(cursor)
    if value is None:
        return position
    try:
        moment = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return position  # not a timestamp: the exact position is all we can do
    return {name: None for name in position} | {cursor: (moment - dt.timedelta(seconds=seconds)).isoformat()}
