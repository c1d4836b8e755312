"""A lake destination (`type: filesystem`): Delta tables merged on the key by dlt, everything else in Delta.

The order of the checkpoint protocol holds as for SQL targets: dlt's load returns after the Delta log
entry of the slice is committed; the binding row is a second Delta commit after it, and the checkpoint
is written after both. A kill between the two commits leaves a table one slice ahead of its binding:
the next run re-reads that slice from the checkpoint and the merge on the key absorbs it.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, ClassVar

import dlt
import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.catalog import Destination
from ingestion_assets.loading.bindings import TABLE as BINDINGS
from ingestion_assets.loading.bindings import Marker
from ingestion_assets.loading.dead_letters import DEAD_LETTER_TABLE, record_keys
from ingestion_assets.loading.lake_children import Written, nested_of, retire_stale_children, stale_children
from ingestion_assets.loading.lake_sql import LakeSqlView, keep_newest_in_duckdb, lake_sql_view
from ingestion_assets.loading.lake_tables import LakeTables, TableStore, _literal
from ingestion_assets.loading.metadata_columns import DELETED_AT, GENERATION, POSITION
from ingestion_assets.loading.migrate import migration_statements
from ingestion_assets.loading.pipeline import Loader, TargetState
from ingestion_assets.loading.unfit import LAKE, split_unfit, with_parked
from ingestion_assets.loading.versions import KeyCheck, newest_per_key, quote_name
from ingestion_assets.schema.changes import SchemaChange
from ingestion_assets.sources.postgres.landing import sql_type_of_arrow

log = logging.getLogger(__name__)


def lake_destination(destination: Destination, credentials: str | dict[str, Any] | None) -> Any:
    options: dict[str, Any] = {"bucket_url": destination.bucket_url, "naming_convention": destination.naming}
    if credentials is not None:
        options["credentials"] = credentials
    return dlt.destinations.filesystem(**options)


@dataclass
class LakeLoader(Loader):
    """The Loader's operations on a lake: reads, deletes and the refresh swap through the table format's own
    API (`tables`); the bookkeeping tables (bindings, dead letters) are Delta tables (`lake`) in every format."""

    lake: LakeTables = field(init=False)
    tables: TableStore = field(init=False)
    restore_at_start: ClassVar[bool] = True  # the table stores below read the pipeline's destination at once

    def __post_init__(self) -> None:
        super().__post_init__()
        self.lake = LakeTables.of(self._pipeline)
        self.tables = self.lake.stream_tables(self._pipeline, self.destination.table_format)

    def load(self, table: pa.Table | None, dead_letters: pa.Table | None = None) -> int:
        """A slice with several versions of a key (a CDC batch: an insert and its delete) is reduced to the newest
        first: a Delta MERGE and pyiceberg's upsert refuse a target row matched by two source rows. Rows with a
        date or time the format's readers cannot hold are parked (loading/unfit.py)."""
        if table is not None and self.target.write_disposition == "merge" and POSITION in table.column_names:
            table = newest_per_key(table, self.target.primary_key, self.target.numeric_position)
        if table is not None and table.num_rows:
            partition = self._bound_partition or ""
            table, parked = split_unfit(
                table, LAKE, self.where(), self.stream_name, partition, self.target.primary_key, self.run_id
            )
            dead_letters = with_parked(dead_letters, parked)
            self._parked_here += 0 if parked is None else parked.num_rows
        if table is not None and table.num_rows and self.target.write_disposition == "merge":
            with self._lock():  # Iceberg: its upsert reads in the snapshot's schema (iceberg.py)
                self.tables.prepare_columns(self.target.table, self._with_target_names(table).schema)
        return super().load(table, dead_letters)

    def _run(self, resources: list[Any], file_format: str | None) -> None:
        """The stream's tables in the destination's table format, the dead letters in Delta (as the bindings);
        on Iceberg the new snapshot is made durable here, before the binding and the checkpoint follow it."""
        for resource in resources:
            bookkeeping = resource.name == DEAD_LETTER_TABLE
            kind = self.destination.table_format
            if bookkeeping or kind != "parquet":  # plain Parquet: dlt's own files, no table format
                resource.apply_hints(table_format="delta" if bookkeeping else kind)
        if not self._merges_nested(resources):
            self._pipeline.run(resources, loader_file_format="parquet")
            if self.tables is not self.lake:
                self.tables.sync(self.target.table)
            return
        self._run_replacing_children(resources)

    def _merges_nested(self, resources: list[Any]) -> bool:
        """Whether API records that may hold lists merge on their key here (their child rows need replacing)."""
        return self.max_table_nesting > 0 and any(
            resource.name == self.target.table and resource.write_disposition == "merge" for resource in resources
        )

    def _run_replacing_children(self, resources: list[Any]) -> None:
        """dlt's run in its three steps: the ids the normalized package holds are read before its load, and after
        it the child rows of each merged record that the load did not write go (loading/lake_children.py); all
        before the binding and the checkpoint."""
        pipeline = self._pipeline
        pending = set(pipeline.list_normalized_load_packages())
        pipeline.extract(resources, loader_file_format="parquet")
        pipeline.normalize()
        schema = pipeline.default_schema
        root = schema.naming.normalize_table_identifier(self.target.table)  # the table as dlt names it
        nested = nested_of(schema, root)
        mine = sorted(set(pipeline.list_normalized_load_packages()) - pending)
        written = Written.of(pipeline, [root, *nested], mine)
        pipeline.load()
        if self.tables is not self.lake:  # Iceberg: each table's new snapshot durable before the checkpoint
            for table in [root, *nested]:
                self.tables.sync(table)
        if written.ids[root]:
            stale = stale_children(self.tables, schema, root, nested, written)
            removed = retire_stale_children(self.tables, schema, stale)
            if removed:
                log.info("%s: %d child row(s) no longer in their merged records' lists removed", self.where(), removed)

    def target_is_empty(self) -> bool:
        with self._lock():
            return not self.tables.has_rows(self.target.table)

    def max_generation(self, table: str) -> int | None:
        with self._lock():
            dataset = self.tables.dataset(table)
            if dataset is None:
                return None
            found = pc.max(dataset.to_table(columns=[GENERATION])[GENERATION]).as_py()
        return None if found is None else int(found)

    def inspect(self, partition: str | None) -> TargetState:
        with self._lock():
            rows = self.tables.has_rows(self.target.table)
            self._known_to_exist = rows is not None
            return TargetState(rows is not None, bool(rows), self.lake.read_marker(self.stream_name, partition))

    def lineage(self) -> str | None:
        with self._lock():
            return self.tables.lineage(self.target.table)

    def went_back(self, lineage: str) -> str | None:
        with self._lock():
            return self.tables.went_back(self.target.table, lineage)

    def bind(self, marker: Marker, partition: str | None, record_now: bool = False) -> None:
        self.bound, self._bound_partition = marker, partition
        if record_now:
            with self._lock():
                self.lake.write_marker(self.stream_name, partition, marker)

    def _advance_marker(self) -> None:
        if self.bound is None:
            return
        self.bound = Marker(self.bound.binding, self.bound.seq + 1, self.bound.generation)
        self.lake.write_marker(self.stream_name, self._bound_partition, self.bound)

    def targettable_exists(self) -> bool:
        with self._lock():
            return self.tables.has_rows(self.target.table) is not None

    def migrate(self, changes: list[tuple[SchemaChange, str, pa.DataType]], exact: bool = False) -> list[str]:
        """A refresh's shadow table holds only what this refresh read: a type change rebuilds it in the new types
        (one commit), so a refresh can start from types the live table cannot take in place. The live table's
        types are not changed in place (the Loader refuses, naming `ingest refresh`)."""
        shadow = self.target.table
        if self.stream_table in (None, shadow):
            return super().migrate(changes, exact)
        changes = [(replace(change, column=self.names.column(change.column)), t, a) for change, t, a in changes]
        self._retype_in_dlt_schema([(change.column, arrow) for change, _, arrow in changes])
        with self._lock():
            dataset = self.tables.dataset(shadow)
            if dataset is None:
                return []  # created by its first load, already with the new types
            self.tables.replace(shadow, retyped_rows(dataset.to_table(), changes))
        return [f"rebuilt {shadow} with {', '.join(c.describe() for c, _, _ in changes)}"]

    def forget_stored_schema(self) -> None:
        """dlt's delta job creates a table that is gone again: nothing to forget."""

    def delete_all(self) -> None:
        with self._lock():
            self.tables.delete(self.target.table)

    def purge_deleted(self) -> None:
        with self._lock():
            self.tables.delete(self.target.table, f"{DELETED_AT} IS NOT NULL")

    def retire_below(self, position: Decimal, soft: bool, within: tuple[str, int, int] | None = None) -> None:
        where = f"{POSITION} < {position}"
        if within is not None:
            column, low, high = within
            where += f" AND {self.names.column(column)} BETWEEN {int(low)} AND {int(high)}"
        with self._lock():
            if soft:
                self.tables.update(self.target.table, {DELETED_AT: "now()"}, f"{where} AND {DELETED_AT} IS NULL")
            else:
                self.tables.delete(self.target.table, where)

    def _check_versions(self, table: pa.Table) -> KeyCheck:
        """The version guard against the table's newest version, joined in an in-memory DuckDB."""
        return keep_newest_in_duckdb(
            self.tables.dataset(self.target.table),
            table,
            self.key,
            self.source_column,
            self.released_sources,
            self.target.numeric_position,
        )

    def swap_in(self, shadow: str, table: str, generation: int | None = None) -> None:
        """The shadow's rows replace the table's in one commit (Delta log entry, Iceberg snapshot); then the
        shadow's folder goes. Its nested tables (lists in API records: `<shadow>__<field>`) replace the table's
        first, and those of the table the new generation has none of are emptied: each child stays tied to a row of
        its generation. A lake commits table by table: a reader in between may see a new child table beside the old
        root (a crash there swaps again, from the shadow that is still there)."""
        with self._lock():
            old_nested, new_nested = self._nested_tables(table), self._nested_tables(shadow)
            moved = {nested: table + nested[len(shadow) :] for nested in new_nested}
            if self.tables.has_rows(shadow) is None:  # the refresh read no row: the stream's tables hold none
                new_nested, moved = [], {}
            ids: dict[str, str] = {}  # a shadow child's dlt id -> the one dlt gives it under the stream's name
            for nested in sorted(moved, key=lambda name: name.count("__")):  # parents before their children
                self._move_nested(nested, moved[nested], ids)
            if not self.tables.overwrite_with(table, shadow):
                self.tables.delete(table)
            for nested in old_nested:
                if nested not in moved.values():
                    self.tables.delete(nested)
            if generation is not None:
                self.lake.set_generation(table, generation)
            # the root's folder first: a shadow without a root is a swap done (see the runner's `_refresh_by_swap`)
            self._remove_folders([shadow, *new_nested])
        self._pipeline.drop()

    def _move_nested(self, nested: str, renamed: str, ids: dict[str, str]) -> None:
        """The shadow's nested table `nested` becomes `renamed`. A lake merges a nested table on `_dlt_id`, which dlt
        derives from the parent's id, the nested table's name and the list position: under the shadow's name each
        child had another id than the next run gives it, which would add it a second time. The ids are made again
        as under the stream's name (their parents' first: `ids`); plain Parquet only appends, its files just move."""
        if self.destination.table_format == "parquet":
            if not self.tables.overwrite_with(renamed, nested):
                self.tables.delete(renamed)
            return
        dataset = self.tables.dataset(nested)
        if dataset is None:
            self.tables.delete(renamed)
            return
        self.tables.replace(renamed, live_child_ids(dataset.to_table(), renamed, ids))

    def _nested_tables(self, table: str) -> list[str]:
        """dlt's nested tables of `table` in the lake (`table__field`, and theirs): the dataset's folders so named."""
        with self._pipeline.destination_client() as client:
            root, fs = client.dataset_path.rstrip("/"), client.fs_client
            if not fs.isdir(root):
                return []
            names = [posixpath.basename(str(path).rstrip("/")) for path in fs.ls(root, detail=False)]
        return sorted(name for name in names if name.startswith(f"{table}__"))

    def _remove_folders(self, tables: list[str]) -> None:
        with self._pipeline.destination_client() as client:
            for name in tables:
                folder = client.make_remote_url(f"{client.dataset_path.rstrip('/')}/{name}")
                if client.fs_client.exists(folder):
                    client.fs_client.rm(folder, recursive=True)

    @contextlib.contextmanager
    def client(self) -> Iterator[LakeSqlView]:
        """A read-only SQL view of the lake's tables under the writer lock (reconciliation, key checks); what
        changes rows goes through deltalake (`retire_keys`, `delete`)."""
        with self._lock(), lake_sql_view(self._dataset) as view:
            yield view

    def held_columns(self) -> frozenset[str] | None:
        with self._lock():
            dataset = self.tables.dataset(self.target.table)
        return frozenset(dataset.schema.names) if dataset is not None else frozenset()

    def _dataset(self, table: str) -> Any:
        bookkeeping = table in (DEAD_LETTER_TABLE, BINDINGS)
        return (self.lake if bookkeeping else self.tables).dataset(table)

    def retire_keys(self, keys: pa.Table, soft: bool) -> int:
        """Reconciliation's deletions (`keys`: the key columns as the target names them). Call inside
        `client()`, which holds the writer lock."""
        return int(self.tables.retire_keys(self.target.table, keys, soft))

    def move_rows(self, column: str, moved: dict[str, str]) -> None:
        """The live rows of each value of `column` in `moved` take its new value (files_deletes: a deleted file's
        keys move to the listed file of the same content), one commit per value. Not inside `client()`."""
        with self._lock():
            for old, new in sorted(moved.items()):
                where = f"{quote_name(column)} = {_literal(old)} AND {DELETED_AT} IS NULL"
                self.tables.update(self.target.table, {column: _literal(new)}, where)

    def mark_deleted(self, marks: pa.Table) -> int:
        """CDC's soft deletes of rows whose values only the target holds (streams/cdc/rows.py `marks_table`:
        the key columns typed as the rows landed, `_ingest_position`, `_ingest_deleted_at`): each key flagged at
        its delete's version and time, in one commit of the table format."""
        with self._lock():
            dataset = self.tables.dataset(self.target.table)
            if dataset is None or not marks.num_rows:
                return 0
            columns: dict[str, Any] = {f"_k{i}": marks.column(k) for i, k in enumerate(self.key)}
            columns["_version"] = marks.column(POSITION).cast(dataset.schema.field(POSITION).type)
            columns["_at"] = marks.column(DELETED_AT).cast(pa.timestamp("us", "UTC"))
            return int(self.tables.flag_deleted(self.target.table, self.key, pa.table(columns)))

    def parked(self) -> set[str]:
        with self._lock():
            return self._lake_parked()

    def _release_parked(self, loaded: pa.Table) -> None:
        if self._parked_keys is None:
            self._parked_keys = self._lake_parked()
        if self._parked_keys:
            keys = record_keys(loaded, self.key)
            self._release_parked_keys(keys.filter(pc.is_in(keys, pa.array(sorted(self._parked_keys)))).to_pylist())

    def _release_parked_keys(self, keys: list[str]) -> None:
        if self._parked_keys is None:
            self._parked_keys = self._lake_parked()
        released = sorted(set(keys) & self._parked_keys)
        for start in range(0, len(released), 500):
            listed = ", ".join(_literal(k) for k in released[start : start + 500])
            predicate = f"stream = {_literal(self.stream_name)} AND record_key IN ({listed})"
            self.lake.delete(DEAD_LETTER_TABLE, predicate)
        self._parked_keys -= set(released)

    def _lake_parked(self) -> set[str]:
        delta = self.lake.open(DEAD_LETTER_TABLE)
        if delta is None:
            return set()
        rows = delta.to_pyarrow_dataset().to_table(columns=["stream", "record_key"])
        mine = rows.filter(pc.equal(rows["stream"], self.stream_name))["record_key"]
        return {str(key) for key in mine.to_pylist()}


def live_child_ids(rows: pa.Table, table: str, ids: dict[str, str]) -> pa.Table:
    """A nested table's rows with the `_dlt_id` dlt gives each under `table` (from its parent's id, as made again in
    `ids`, and its list position), and `_dlt_parent_id` pointing at that new parent id; `ids` learns the new ids."""
    from dlt.common.normalizers.json.helpers import get_nested_row_hash

    needed = ("_dlt_id", "_dlt_parent_id", "_dlt_list_idx")
    if rows.num_rows == 0 or not all(name in rows.column_names for name in needed):
        return rows
    parents = [ids.get(parent, parent) for parent in rows.column("_dlt_parent_id").to_pylist()]
    places = rows.column("_dlt_list_idx").to_pylist()
    made = [get_nested_row_hash(parent, table, int(place)) for parent, place in zip(parents, places, strict=True)]
    ids.update(zip(rows.column("_dlt_id").to_pylist(), made, strict=True))
    for name, values in (("_dlt_id", made), ("_dlt_parent_id", parents)):
        index = rows.column_names.index(name)
        rows = rows.set_column(index, rows.schema.field(index), pa.array(values, rows.schema.field(index).type))
    return rows


def retyped_rows(rows: pa.Table, changes: list[tuple[SchemaChange, str, pa.DataType]]) -> pa.Table:
    """`rows` with each changed column in its new type, cast as a DuckDB target's column is (loading/migrate.py:
    a widened column cast, an incompatible one's old values kept as text in `<column>__<old type>`)."""
    with contextlib.closing(duckdb.connect()) as con:
        con.register("_ingest_rows", rows)
        con.execute("CREATE TEMP TABLE _ingest_retyped AS SELECT * FROM _ingest_rows")
        for change, _, arrow in changes:
            new_type = sql_type_of_arrow(arrow, "duckdb")
            for statement in migration_statements("duckdb", "_ingest_retyped", change, new_type, quote_name):
                con.execute(statement)
        result = con.sql("SELECT * FROM _ingest_retyped").to_arrow_table()
    fields = {**{f.name: f for f in rows.schema}, **{c.column: pa.field(c.column, arrow) for c, _, arrow in changes}}
    return result.cast(pa.schema([fields.get(f.name, f) for f in result.schema]))
