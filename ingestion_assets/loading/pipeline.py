"""One dlt pipeline per stream run: it loads slice after slice and runs stateless.

dlt is imported where a load, dlt's schema or a dead letter needs it: a run with nothing new to load asks its target
through our own SQL client (loading/target_sql.py) and never imports dlt."""

from __future__ import annotations

import contextlib
import gc
import logging
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.catalog import Destination
from ingestion_assets.loading.bindings import Marker, read_marker, set_generation, write_marker
from ingestion_assets.loading.dead_letters import key_part, record_keys
from ingestion_assets.loading.destinations import describe_destination, make_destination, target_names, writer_lock
from ingestion_assets.loading.metadata_columns import DLT_HINTS, GENERATION
from ingestion_assets.loading.migrate import ValuesWouldBeLost, lost_values, migration_statements
from ingestion_assets.loading.naming import TargetNames
from ingestion_assets.loading.native_types import for_postgres
from ingestion_assets.loading.parked import dead_letter_resource, delete_parked, parked_keys
from ingestion_assets.loading.relations import nested_tables, table_exists
from ingestion_assets.loading.sql_clients import direct_sql_client, has_direct_client
from ingestion_assets.loading.target_sql import undefined_relation
from ingestion_assets.loading.versions import KeyCheck, check_keys
from ingestion_assets.schema.changes import SchemaChange
from ingestion_assets.settings import Settings

log = logging.getLogger(__name__)


_FRESH_IN_THIS_PROCESS: set[str] = set()  # dlt working folders this process started afresh
_RESTORED_IN_THIS_PROCESS: set[str] = set()  # ... and whose dlt schema it then restored from the destination


class _ExpectedHintNotice(logging.Filter):
    """dlt warns each load that our JSON hints differ from Arrow's string type: that is intended."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "several column hints were different" not in record.getMessage()


_HINT_NOTICE = _ExpectedHintNotice()


@dataclass(frozen=True)
class TargetTable:
    """Where and how one stream lands."""

    dataset: str  # the source name
    table: str  # the stream name (or a refresh's shadow table)
    primary_key: tuple[str, ...]
    write_disposition: str  # merge | append | replace
    type_hints: tuple[tuple[str, dict[str, Any]], ...] = ()  # (column, dlt hint) the Arrow type cannot carry
    source_columns: tuple[str, ...] = ()  # every column the source sends (checked for name collisions)
    # `_ingest_position` is a numeric's text (one cursor column, a numeric without limits): versions compare by
    # value (loading/number_order.py), 9.5 below 10
    numeric_position: bool = False

    def column_hints(self, names: TargetNames, disposition: str = "merge") -> dict[str, dict[str, Any]]:
        """dlt's column hints for a load with `disposition`: `dedup_sort` only where dlt merges (elsewhere dlt
        warns, on every run, that it ignores it)."""
        hints: dict[str, dict[str, Any]] = {names.column(name): dict(hint) for name, hint in self.type_hints}
        for name in names.columns(self.primary_key):
            hints[name] = {**hints.get(name, {}), "nullable": False, "primary_key": True}
        for name, hint in DLT_HINTS.items():
            hints[name] = hint if disposition == "merge" else {k: v for k, v in hint.items() if k != "dedup_sort"}
        return hints


MYSQL_ALTER_WAIT_SECONDS = 60


class MetadataLockWait(RuntimeError):
    """MariaDB/MySQL: a widening ALTER waited its time for the table's metadata lock, which an open transaction of
    another session holds; the message names those sessions. Retried as the lock wait it is."""

    transient = True

    def __init__(self, table: str, seconds: int, holders: list[str]) -> None:
        named = "; ".join(holders) or "no open transaction found now (it may have ended)"
        super().__init__(
            f"target {table}: widening a column waited {seconds} s for the table's metadata lock, held by the open "
            f"transaction of another session: {named}. Nothing was changed and the checkpoint is kept; end that "
            "session's transaction (or KILL its id) and run again"
        )


def lock_holders(client: Any) -> list[str]:
    """The other sessions with an open transaction (the holders an ALTER waits for): id, user@host, what they
    do, since when. Never their statements' text (values of rows)."""
    try:
        rows = client.execute_sql(
            "SELECT p.id, p.user, p.host, p.command, p.time, t.trx_started FROM information_schema.innodb_trx t "
            "JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id WHERE p.id <> CONNECTION_ID() "
            "ORDER BY t.trx_started"
        )
    except Exception as exc:  # noqa: BLE001 - the lock wait is the error to report; this only names its holder
        return [f"not found ({type(exc).__name__})"]
    own = _own_endpoints()
    return [
        f"session {session} ({user}@{host}, {command.lower()} for {idle} s, in a transaction since {started}"
        + (", a connection of this very process" if str(host) in own else "")
        + ")"
        for session, user, host, command, idle, started in rows or []
    ]


def _own_endpoints() -> set[str]:
    """This process's TCP endpoints as a server names its clients (`host:port`): a holder among them is ours."""
    import psutil

    try:
        return {f"{c.laddr.ip}:{c.laddr.port}" for c in psutil.Process().net_connections("tcp") if c.laddr}
    except psutil.Error:
        return set()


@dataclass
class Loader:
    """Loads Arrow slices into one target table; each `load` returns only after the commit."""

    settings: Settings
    destination: Destination
    target: TargetTable
    pipeline_name: str
    guard_versions: bool = False  # several writers (partitions, live tail): keep the newest version
    version_source: str | None = None  # files: the column naming a row's file, whose re-read replaces its rows
    stream_table: str | None = None  # the stream's table when `target` is a refresh's shadow of it
    max_table_nesting: int = 0  # API records: nested objects and lists become child tables up to this depth
    names: TargetNames = field(init=False)
    bound: Marker | None = field(default=None, init=False)  # what the target holds for this run's partition
    _bound_partition: str | None = field(default=None, init=False)
    key: tuple[str, ...] = field(init=False)  # the primary key as the target names it
    source_column: str | None = field(init=False)  # version_source as the target names it
    # files gone from the source (their rows about to be retired): their rows never win over incoming ones
    released_sources: frozenset[str] = field(default=frozenset(), init=False)
    _parked_keys: set[str] | None = field(default=None, init=False)
    _known_to_exist: bool = field(default=False, init=False)  # seen in this run: no need to look again
    _dlt_pipeline: Any = field(default=None, init=False, repr=False)  # made on first use: `_pipeline`
    _loads: int = field(default=0, init=False)
    _append_only: bool = field(default=False, init=False)
    _unique_key_known: bool = field(default=False, init=False)  # PostgreSQL: the merge's unique index is there
    _bindings_known: bool = field(default=False, init=False)  # PostgreSQL: the bindings table is there
    _sql_client: Any = field(default=None, init=False, repr=False)  # PostgreSQL and batch loads: reused_client
    _target_columns: frozenset[str] | None = field(default=None, init=False)  # batch loads: the table's columns
    run_id: str = field(default="", init=False)  # the Dagster run loading: rows the loader parks name it
    _parked_here: int = field(default=0, init=False)  # rows this loader parked itself (values the target cannot hold)
    _restore_pending: bool = field(default=False, init=False)  # dlt's schema not yet restored from the destination
    _lock_holder: int | None = field(default=None, init=False)  # the thread holding the writer lock through `_lock`
    _forget_pending: bool = field(default=False, init=False)  # `forget_stored_schema` asked, not yet done
    # Restore dlt's schema when the loader is made, not at its first dlt load (lakes: their tables use it at once).
    restore_at_start: ClassVar[bool] = False

    def __post_init__(self) -> None:
        self.names = target_names(self.destination)
        where = f"target {self.target.dataset}.{self.stream_table or self.target.table}"
        self.names.check(where, self.target.source_columns)
        self.key = self.names.columns(self.target.primary_key)
        self.source_column = self.names.column(self.version_source) if self.version_source else None
        logging.getLogger("dlt").addFilter(_HINT_NOTICE)  # a set: adding it again changes nothing
        if self.restore_at_start:
            self._restore_schema()

    @property
    def _pipeline(self) -> Any:
        """dlt's pipeline, made when a load or dlt's schema first needs it: a run that loads nothing, or loads
        through PostgreSQL's COPY, never pays for it (SQL goes through `sql_client`)."""
        return self._ensure_pipeline()

    def _ensure_pipeline(self) -> Any:
        if self._dlt_pipeline is None:
            self._dlt_pipeline = self._make_pipeline()
        return self._dlt_pipeline

    def _make_pipeline(self) -> Any:
        import dlt

        # Loaded packages are not kept (a slice is re-read from the source, never from local files), and
        # the staging copy of a merged slice is emptied: neither disk grows with the number of runs.
        dlt.config["load.delete_completed_jobs"] = True
        dlt.config["load.truncate_staging_dataset"] = True
        # dlt's working folder is disposable: the checkpoint in Dagster is the truth and dlt's schema lives in the
        # destination too. A fresh folder in each process means no leftover of a killed run (a half-made folder,
        # stale packages) can block the stream; the schema is then restored from the destination.
        folder = self.settings.dlt_dir / self.pipeline_name
        if str(folder) not in _FRESH_IN_THIS_PROCESS:
            shutil.rmtree(folder, ignore_errors=True)
            _FRESH_IN_THIS_PROCESS.add(str(folder))
        pipeline = dlt.pipeline(
            pipeline_name=self.pipeline_name,
            pipelines_dir=str(self.settings.dlt_dir),
            destination=make_destination(self.settings, self.destination),
            dataset_name=self.target.dataset,
        )
        # SIGTERM/SIGINT belong to the drain (finish the slice in flight, then stop); dlt's own interception
        # would take them during a load and abort that very slice (seen in CI as a flaky drain test).
        pipeline.config.runtime.intercept_signals = False
        # dlt's schema is restored from the destination only when dlt loads or its schema is read (`pipeline`).
        self._restore_pending = str(folder) not in _RESTORED_IN_THIS_PROCESS
        if not self._restore_pending:
            pipeline.abort_packages()  # packages an earlier failed load of this process left: stale re-reads
        return pipeline

    def _restore_schema(self) -> None:
        """dlt's schema, restored once from the destination before dlt first loads or its schema is read."""
        self._ensure_pipeline()  # made first: it tells whether this process restored the schema already
        if not self._restore_pending:
            return
        with self._lock():  # it opens the destination: DuckDB admits one process at a time (reentrant)
            self._sync_destination()

    def _sync_destination(self) -> None:
        if self._restore_pending:
            self._pipeline.sync_destination()
            _RESTORED_IN_THIS_PROCESS.add(str(self.settings.dlt_dir / self.pipeline_name))
            self._restore_pending = False

    def use_initial_load_path(self) -> bool:
        """Merge as a plain append when no row of this run can already be in the target.

        Sound only for a run that reads from the very start into an empty target in one snapshot, with
        no other writer: every key then arrives once. A crash moves the next run onto the merge path
        (it has a checkpoint, or the target is no longer empty).
        """
        # Child tables of nested records need the root key a merge adds from the first load on.
        plain = self.target.write_disposition == "merge" and not self.guard_versions and self.max_table_nesting == 0
        if plain and self.target_is_empty():
            self._append_only = True
        return self._append_only

    @property
    def append_only(self) -> bool:
        """The initial-load path was taken (`use_initial_load_path`): no row of this run is in the target yet."""
        return self._append_only

    def target_is_empty(self) -> bool:
        with self._lock(), self.sql_client() as client:
            try:
                return not client.execute_sql(
                    f"SELECT 1 FROM {client.make_qualified_table_name(self.target.table)} LIMIT 1"
                )
            except undefined_relation():
                return True

    def max_generation(self, table: str) -> int | None:
        """The generation a table holds (None: no such table, or empty)."""
        with self._lock(), self.sql_client() as client:
            try:
                rows = client.execute_sql(f"SELECT max({GENERATION}) FROM {client.make_qualified_table_name(table)}")
            except undefined_relation():
                return None
        return int(rows[0][0]) if rows and rows[0][0] is not None else None

    def lineage(self) -> str | None:
        """Where the target table is in its own history (a lake's version or snapshot), for the checkpoint to
        record; None where tables keep no history (SQL targets: a restore shows in `_ingest_bindings`)."""
        return None

    def went_back(self, lineage: str) -> str | None:
        """Why the table no longer holds what it held at `lineage` (None: it does)."""
        return None

    def take_parked(self) -> int:
        """How many rows the loader itself parked since it was last asked (a value the destination cannot hold):
        the run counts them with the reader's dead letters."""
        parked, self._parked_here = self._parked_here, 0
        return parked

    def load(self, table: pa.Table | None, dead_letters: pa.Table | None = None) -> int:
        """Load one slice and its dead letters in one dlt run; returns how many rows went in (stale
        versions are left out). Parked rows of this stream that now loaded leave the dead-letter table."""
        disposition = self.target.write_disposition
        if disposition == "replace" and self._loads > 0:
            disposition = "append"  # one run replaces once, then adds its later slices
        if self._append_only:
            disposition = "append"
        table = self._with_target_names(table) if table is not None and table.num_columns else None
        if self.destination.type == "postgres" and self.max_table_nesting == 0:
            from ingestion_assets.loading.postgres_load import load_slice as load_postgres_slice

            loaded = load_postgres_slice(self, table, dead_letters, disposition)  # COPY + merge, no dlt load
            self._loads += 1
            return loaded
        if disposition in ("append", "merge") and self._loads_directly() and (self.key or disposition == "append"):
            from ingestion_assets.loading.duckdb_batch import TableSlice, load_tables  # it imports this module

            append = disposition == "append"
            (done,) = load_tables([TableSlice(self, table, dead_letters, append=append, checked=not append)])
            return done.rows
        import dlt

        if table is not None and self.destination.type == "postgres":
            table = for_postgres(table)
        with self._lock():
            if self.guard_versions and table is not None:
                check = self._check_versions(table)
                table = check.rows
                if check.existing == 0 and disposition == "merge" and _keys_unique(table, self.key):
                    disposition = "append"  # none of its keys is there yet and no one else writes now
            resources = []
            if table is not None and table.num_rows:
                resources.append(dlt.resource([table], **self._resource_hints(disposition)))
            if dead_letters is not None and dead_letters.num_rows:
                resources.append(dead_letter_resource(dead_letters, self.destination.type == "postgres"))
                self._parked_keys = None  # re-read: the table now holds new entries
            if resources:
                self._run(resources, self._file_format)
            self._advance_marker()
            if table is not None and table.num_rows:
                self._release_parked(table)
        self._loads += 1
        # dlt's config resolution leaves exception tracebacks in reference cycles whose frames still see
        # the slice; without a collection per slice, several slices stay alive and memory climbs.
        gc.collect()
        return 0 if table is None else int(table.num_rows)

    def _loads_directly(self) -> bool:
        """A DuckDB slice goes from Arrow into the table in one transaction with its bindings row
        (loading/duckdb_batch.py): appended as is when no target row can match, else merged in SQL after the same
        version check dlt's merge had here. dlt's extract, normalize and load of a package cost more than the
        insert itself (~0.5 s per 500k-row slice), and their reference cycles a full collection per slice.
        dlt still creates and alters the table (and its stored schema) from an empty slice with the same hints."""
        return type(self) is Loader and self.destination.type == "duckdb" and self.max_table_nesting == 0

    def bind(self, marker: Marker, partition: str | None, record_now: bool = False) -> None:
        """From now on every committed load records in the target that it holds `marker` plus one slice.
        `record_now`: say so at once (a new binding of a target that already holds the stream's table)."""
        self.bound, self._bound_partition = marker, partition
        if record_now:
            with self.client() as client:
                write_marker(client, self.stream_name, partition, marker)

    def inspect(self, partition: str | None) -> TargetState:
        """What the target holds for the stream partition, in one visit (a DuckDB open costs ~50 ms)."""
        with self._lock(), self.sql_client() as client:
            table = client.make_qualified_table_name(self.target.table)
            try:
                rows = bool(client.execute_sql(f"SELECT 1 FROM {table} LIMIT 1"))
                exists = True
            except undefined_relation():
                rows, exists = False, False
            self._known_to_exist = exists
            return TargetState(exists, rows, read_marker(client, self.stream_name, partition))

    def where(self) -> str:
        """The destination, for messages and checkpoints (never a secret)."""
        return describe_destination(self.settings, self.destination)

    def _check_versions(self, table: pa.Table) -> KeyCheck:
        with self.sql_client() as client:
            return check_keys(
                client,
                self.destination.type,
                self.target.table,
                self.key,
                table,
                self.source_column,
                self.released_sources,
                self.target.numeric_position,
            )

    def _run(self, resources: list[Any], file_format: str | None) -> None:
        options: dict[str, Any] = {} if file_format is None else {"loader_file_format": file_format}
        if self.destination.is_lake:
            options["table_format"] = self.destination.table_format
        self.pipeline.run(resources, **options)

    def _ensure_dataset(self) -> None:
        """The dataset (schema) the binding's table lives in, made if no load made it (nothing to load yet)."""
        with self.sql_client() as client:
            if hasattr(client, "has_dataset"):  # dlt's own client (sqlalchemy destinations)
                if not client.has_dataset():
                    client.create_dataset()
            else:  # DuckDB, PostgreSQL: the product's thin client
                client.execute_sql(f"CREATE SCHEMA IF NOT EXISTS {client.fully_qualified_dataset_name()}")

    def _advance_marker(self) -> None:
        """After the data committed and before the checkpoint: the target holds one more slice."""
        self.bound = self.next_marker()
        if self.bound is None:
            return
        with self.sql_client() as client:
            write_marker(client, self.stream_name, self._bound_partition, self.bound)

    def next_marker(self) -> Marker | None:
        """What the target holds once the slice in hand commits (None: the loader is not bound)."""
        if self.bound is None:
            return None
        return Marker(self.bound.binding, self.bound.seq + 1, self.bound.generation)

    def reused_client(self) -> Any:
        """One SQL client for the loader's run (each `with` opens its own connection; on a lake or a dlt-only
        destination, dlt's: resolving dlt's configuration for a new client costs more than a small slice's
        statements)."""
        if self._sql_client is None:
            self._sql_client = self.sql_client()
        return self._sql_client

    def create_if_missing(self, empty: pa.Table) -> None:
        """A stream of an empty table still gets its (empty) target table, with every column and type."""
        if not (self._known_to_exist or self.targettable_exists()):
            import dlt

            with self._lock():
                resource = dlt.resource([self._with_target_names(empty)], **self._resource_hints("append"))
                self._run([resource], self._file_format)

    def prepare_ahead(self, empty: pa.Table) -> None:
        """Before the first slice, while it is read: the PostgreSQL COPY path, and DuckDB's direct appends, make
        a missing table with a dlt run of an empty slice (~1-2 s of a first load), which needs no rows; other
        loads make it with their first load. A slice with columns the table lacks still adds them when it loads."""
        copied = self.destination.type == "postgres" and self.max_table_nesting == 0
        appended = self._loads_directly() and (self._append_only or self.target.write_disposition == "append")
        if copied or appended:
            self.create_if_missing(empty)

    def forget_stored_schema(self) -> None:
        """The table was dropped behind dlt's back: dlt skips its migration while the destination still holds
        its schema's version, so it would load into a table that is gone. Without that record, dlt compares
        its schema with the tables really there at the next load and creates what is missing.

        Done when dlt is next used (`pipeline`), not now: making dlt's pipeline and restoring its schema costs
        ~0.3 s that a first load otherwise spends while its first slice is read (`prepare_ahead`)."""
        self._forget_pending = True

    def _forget_now(self) -> None:
        from dlt.destinations.exceptions import DatabaseUndefinedRelation

        self._forget_pending = False
        name = self._pipeline.default_schema_name
        if name is None:
            return
        with self.sql_client() as client:
            versions = client.make_qualified_table_name(self._pipeline.default_schema.version_table_name)
            with contextlib.suppress(DatabaseUndefinedRelation):
                client.execute_sql(f"DELETE FROM {versions} WHERE schema_name = %s", name)

    def targettable_exists(self) -> bool:
        with self._lock(), self.sql_client() as client:
            return table_exists(client, client.make_qualified_table_name(self.target.table))

    def delete_all(self) -> None:
        """A TRUNCATE in the source, applied: the target table empties, in one statement."""
        self._execute_iftable_exists("DELETE FROM {table}")

    def purge_deleted(self) -> None:
        """Hard deletes: tombstones (rows with `_ingest_deleted_at`) leave the table once merged."""
        self._execute_iftable_exists("DELETE FROM {table} WHERE _ingest_deleted_at IS NOT NULL")

    def retire_below(self, position: Decimal, soft: bool, within: tuple[str, int, int] | None = None) -> None:
        """After a complete snapshot at `position`: every row that still exists was rewritten at it, so a row
        below it (from an interrupted earlier snapshot, or from before a WAL gap) was deleted in the source.
        `within` (integer column, low, high) limits this to the key range a history chunk copied."""
        where = f"_ingest_position < {position}"
        if within is not None:
            _, low, high = within
            where += f" AND {{column}} BETWEEN {int(low)} AND {int(high)}"
        if soft:
            where += " AND _ingest_deleted_at IS NULL"
            statement = f"UPDATE {{table}} SET _ingest_deleted_at = CURRENT_TIMESTAMP WHERE {where}"
        else:
            statement = f"DELETE FROM {{table}} WHERE {where}"
        self._execute_iftable_exists(statement, column=self.names.column(within[0]) if within else None)

    def _execute_iftable_exists(self, statement: str, column: str | None = None) -> None:
        with self._lock(), self.sql_client() as client:
            table = client.make_qualified_table_name(self.target.table)
            if table_exists(client, table):
                quoted = client.escape_column_name(column) if column is not None else ""
                client.execute_sql(statement.format(table=table, column=quoted))

    def load_records(
        self,
        records: list[dict[str, Any]],
        dead_letters: pa.Table | None = None,
        column_hints: dict[str, dict[str, Any]] | None = None,
    ) -> int:
        """Load one slice of JSON records (nested data becomes child tables) and its dead letters; `column_hints`
        (by field name) say what the values cannot (a decimal's precision and scale)."""
        import dlt

        disposition = "append" if self._append_only else self.target.write_disposition
        with self._lock():
            resources = []
            if records:
                columns = self.target.column_hints(self.names, disposition)
                for name, hint in (column_hints or {}).items():
                    column = self.names.column(name)
                    columns[column] = {**columns.get(column, {}), **hint}
                hints: dict[str, Any] = {
                    "name": self.target.table,
                    "table_name": self.target.table,
                    "write_disposition": disposition,
                    "primary_key": list(self.key),
                    "columns": columns,
                    "max_table_nesting": self.max_table_nesting,
                }
                resources.append(dlt.resource(records, **hints))
            if dead_letters is not None and dead_letters.num_rows:
                resources.append(dead_letter_resource(dead_letters, self.destination.type == "postgres"))
                self._parked_keys = None
            if resources:
                self._run(resources, None)
            elif self.bound is not None:  # an API's first read found nothing: no load made the dataset yet
                self._ensure_dataset()
            self._advance_marker()
            keys = ["|".join(key_part(str(r.get(k))) for k in self.target.primary_key) for r in records]
            self._release_parked_keys(keys)
        gc.collect()
        return len(records)

    def _release_parked(self, loaded: pa.Table) -> None:
        """Rows that loaded leave the dead-letter table (they were parked by an earlier run)."""
        if self._parked_keys is None:
            self._parked_keys = parked_keys(self, self.stream_name)
        if not self._parked_keys:
            return
        keys = record_keys(loaded, self.key)
        self._release_parked_keys(keys.filter(pc.is_in(keys, pa.array(sorted(self._parked_keys)))).to_pylist())

    def _release_parked_keys(self, keys: list[str]) -> None:
        if self._parked_keys is None:
            self._parked_keys = parked_keys(self, self.stream_name)
        released = sorted(set(keys) & self._parked_keys)
        if released:
            delete_parked(self, self.stream_name, released)
            self._parked_keys -= set(released)

    @contextlib.contextmanager
    def client(self) -> Iterator[Any]:
        """A SQL client on the target, under the writer lock (DuckDB admits no reader beside a writer)."""
        with self._lock(), self.sql_client() as client:
            yield client

    def held_columns(self) -> frozenset[str] | None:
        """The target table's columns as the target names them (empty: no table), for destinations whose catalog
        streams/target_types.py does not read (MariaDB/MySQL, lakes); None where they are not read at all."""
        return None

    def held_types(self) -> dict[str, str] | None:
        """The target table's columns (as the target names them) -> their SQL type as its catalog spells it (empty:
        no table), for destinations whose catalog streams/target_types.py does not read (MariaDB/MySQL); None
        where they are not read at all."""
        return None

    def parked(self) -> set[str]:
        """Record keys of this stream waiting in the dead-letter table (under the writer lock: an open DuckDB
        connection of this process keeps every other process's loads out; found in parallel backfills)."""
        with self._lock():
            return parked_keys(self, self.stream_name)

    def migrate(self, changes: list[tuple[SchemaChange, str, pa.DataType]], exact: bool = False) -> list[str]:
        """Apply (change, new SQL type, new Arrow type) to the target and to dlt's staging copy of it.

        dlt never alters a column type, and it merges through a staging table it creates from its own
        schema: the tables change here, and dlt's schema learns the new type for the tables it creates.
        A conversion that would not keep every value the target holds raises ValuesWouldBeLost, changing
        nothing, when `exact` (a stream that does not read those rows again); else it is logged: the old
        values stay in the history column and the stream's rows are read again."""
        from ingestion_assets.loading.sql_targets import refuse_retype

        kind = self.destination.type
        if kind != "sqlalchemy":
            refuse_retype(kind, f"{self.target.dataset}.{self.stream_name}", [c for c, _, _ in changes])
        changes = [(replace(change, column=self.names.column(change.column)), t, a) for change, t, a in changes]
        self._count_lost_values(changes, exact)
        if kind == "sqlalchemy":
            return self._widen_mysql(changes)
        self._retype_in_dlt_schema([(change.column, arrow) for change, _, arrow in changes])
        done: list[str] = []
        with self._lock(), self.sql_client() as client:
            for scoped, table, staging in self._existing_tables(client):
                statements = [
                    statement
                    for change, new_type, _ in changes
                    for statement in migration_statements(
                        kind, table, change, new_type, scoped.escape_column_name, staging
                    )
                ]
                with scoped.begin_transaction():
                    for statement in statements:
                        scoped.execute_sql(statement)
                done += statements
        return done

    def _existing_tables(self, client: Any) -> Iterator[tuple[Any, str, bool]]:
        """The target table and dlt's staging copy of it, those that exist: (the client scoped to its dataset, the
        qualified name, whether it is the staging copy). One not there yet is created by its first load, already
        with the new types."""
        for staging in (False, True):
            context = client.with_staging_dataset() if staging else contextlib.nullcontext(client)
            with context as scoped:
                table = scoped.make_qualified_table_name(self.target.table)
                if table_exists(scoped, table):
                    yield scoped, table, staging

    def _widen_mysql(self, changes: list[tuple[SchemaChange, str, pa.DataType]]) -> list[str]:
        """MariaDB/MySQL: widen the columns of the target and of dlt's staging copy in place; a change that is no
        widening there is refused (RetypeRefused, naming a refresh) before anything changed. A table not created
        yet (a refresh's new one) takes the new types at its first load."""
        from ingestion_assets.loading.sql_targets import mysql_retype

        done: list[str] = []
        with self._lock(), self.sql_client() as client:
            for scoped, table, _ in self._existing_tables(client):
                statements = mysql_retype(scoped, table, changes)
                # an ALTER waits for every open transaction that touched the table (MariaDB's metadata lock:
                # lock_wait_timeout is a day by default): fail after a minute, naming the lock, not hang
                scoped.execute_sql(f"SET SESSION lock_wait_timeout = {MYSQL_ALTER_WAIT_SECONDS}")
                for statement in statements:
                    try:
                        scoped.execute_sql(statement)
                    except Exception as exc:
                        if "1205" not in str(exc):  # not MariaDB's "Lock wait timeout exceeded"
                            raise
                        raise MetadataLockWait(table, MYSQL_ALTER_WAIT_SECONDS, lock_holders(scoped)) from exc
                done += statements
        self._retype_in_dlt_schema([(change.column, arrow) for change, _, arrow in changes])
        return done

    def _count_lost_values(self, changes: list[tuple[SchemaChange, str, pa.DataType]], exact: bool) -> None:
        from dlt.destinations.exceptions import DatabaseException  # here: a run without a change never needs dlt

        with self._lock(), self.sql_client() as client:
            table = client.make_qualified_table_name(self.target.table)
            if not table_exists(client, table):
                return
            for change, new_type, _ in changes:
                try:
                    count, sample = lost_values(client, self.destination.type, self.target.table, change, new_type)
                except DatabaseException as exc:  # a type the count cannot cast back to: nothing is known
                    count, sample = -1, f"not counted: {type(exc).__name__}"
                if count and exact:
                    raise ValuesWouldBeLost(table, change, new_type, count, sample)
                if count:
                    log.warning(
                        "target %s: %d value(s) (-1: unknown) of column %r may not convert to %s (e.g. %r): they "
                        "are kept in its history column until the stream's rows are read again",
                        table,
                        count,
                        change.column,
                        new_type,
                        sample,
                    )

    def _retype_in_dlt_schema(self, columns: list[tuple[str, pa.DataType]]) -> None:
        from dlt.common.libs.pyarrow import get_column_type_from_py_arrow

        pipeline = self.pipeline
        if pipeline.default_schema_name is None:
            return  # a pipeline that never loaded (another partition's created the table): dlt reads it at its load
        table = pipeline.default_schema.tables.get(self.target.table)
        if table is None:
            return
        for name, arrow_type in columns:
            column = table["columns"].get(name)
            if column is not None:
                for hint in ("precision", "scale", "timezone"):
                    column.pop(hint, None)
                column.update(get_column_type_from_py_arrow(arrow_type))

    def swap_in(self, shadow: str, table: str, generation: int | None = None) -> None:
        """Replace `table` by `shadow` in one transaction: readers see the old or the new generation."""
        with self._lock(), self.sql_client() as client:
            target = client.make_qualified_table_name(table)
            source = client.make_qualified_table_name(shadow)
            # asked before the transaction: a failed statement would abort a PostgreSQL one
            shadow_exists, target_exists = table_exists(client, source), table_exists(client, target)
            # the nested tables (lists in API records) go with their root: the old ones hold the old rows' children
            old_nested, new_nested = nested_tables(client, table), nested_tables(client, shadow)
            with client.begin_transaction():
                if not shadow_exists:  # the refresh read no row: the stream's table holds none
                    if target_exists:
                        client.execute_sql(f"DELETE FROM {target}")
                    for nested in old_nested:
                        client.execute_sql(f"DELETE FROM {client.make_qualified_table_name(nested)}")
                else:
                    client.execute_sql(f"DROP TABLE IF EXISTS {target}")
                    client.execute_sql(f"ALTER TABLE {source} RENAME TO {client.escape_column_name(table)}")
                    for nested in old_nested:
                        client.execute_sql(f"DROP TABLE IF EXISTS {client.make_qualified_table_name(nested)}")
                    for nested in new_nested:
                        moved, renamed = client.make_qualified_table_name(nested), table + nested[len(shadow) :]
                        client.execute_sql(f"ALTER TABLE {moved} RENAME TO {client.escape_column_name(renamed)}")
                if generation is not None:
                    set_generation(client, table, generation)
        # The shadow had a pipeline (and dlt schema) of its own, named after it; its table is gone now, so
        # its local working folder goes too. Each generation's shadow has a new name: no schema expects it.
        self._pipeline.drop()

    def _resource_hints(self, disposition: str) -> dict[str, Any]:
        return {
            "name": self.target.table,
            "table_name": self.target.table,
            "write_disposition": disposition,
            "primary_key": list(self.key),
            "columns": self.target.column_hints(self.names, disposition),
        }

    def _with_target_names(self, table: pa.Table) -> pa.Table:
        """The slice's columns renamed as dlt will name them, so our own SQL on the target sees the same."""
        renamed = list(self.names.columns(table.column_names))
        return table if renamed == table.column_names else table.rename_columns(renamed)

    @property
    def _file_format(self) -> str:
        from ingestion_assets.loading.postgres_copy import LOADER_FILE_FORMAT  # it imports dlt: for dlt loads

        return LOADER_FILE_FORMAT if self.destination.type == "postgres" else "parquet"

    @property
    def pipeline(self) -> Any:
        """dlt's pipeline with its schema restored, for a dlt load or dlt's schema: under this loader's `_lock` or
        with no writer lock of the target held (it takes it). SQL alone goes through `sql_client`."""
        self._restore_schema()
        if self._forget_pending:
            with self._lock():
                self._forget_now()
        return self._pipeline

    def sql_client(self) -> Any:
        """A new SQL client on the target (its own connection once entered): SQL needs no dlt schema, and on
        DuckDB and PostgreSQL not dlt at all (loading/target_sql.py); elsewhere it is the dlt pipeline's."""
        if has_direct_client(self.destination):
            return direct_sql_client(self.settings, self.destination, self.names, self.target.dataset)
        return self._pipeline.sql_client()

    @property
    def stream_name(self) -> str:
        return self.stream_table or self.target.table

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The writer lock across several short steps of this thread (each `client` inside it opens no lock and,
        on DuckDB, not the file again: ~50 ms of CPU per step saved in a run with nothing new)."""
        with self._lock():
            yield

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        if self._lock_holder == threading.get_ident():  # inside `held` (or a step that took it): already ours
            yield
            return
        table = self.stream_table or self.target.table
        with writer_lock(self.settings, self.destination, self.target.dataset, table):
            self._lock_holder = threading.get_ident()
            try:
                yield
            finally:
                self._lock_holder = None


@dataclass(frozen=True)
class TargetState:
    exists: bool  # the table is there
    has_rows: bool
    marker: Marker | None  # what the target says it holds for the partition (None: nothing)


def _keys_unique(table: pa.Table, primary_key: tuple[str, ...]) -> bool:
    """Whether each key appears once: a batch of log changes may hold several versions of a row (an insert
    and its delete), which only a merge reduces to the newest (found by the CDC history simulation)."""
    if table.num_rows < 2:
        return True
    return bool(table.group_by(list(primary_key)).aggregate([]).num_rows == table.num_rows)


def pipeline_name(source: str, stream: str, partition: str | None) -> str:
    suffix = "" if partition is None else "__" + "".join(ch if ch.isalnum() else "_" for ch in partition)
    return f"ingest__{source}__{stream}{suffix}"
