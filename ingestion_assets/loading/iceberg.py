"""Iceberg stream tables of a lake destination (`table_format: iceberg`), opened with pyiceberg.

dlt writes the slices (merge = pyiceberg's upsert on the key, one snapshot per 1,000 rows). What dlt cannot do
is done here, each change as one snapshot commit: deletes and updates by a SQL predicate are evaluated in an
in-memory DuckDB over the table's rows and written back with one `overwrite` (copy-on-write, as pyiceberg
writes), the refresh swap overwrites the table with the shadow's rows. The table is found by its newest
metadata file, so dlt's default catalog (in memory, rebuilt per client) and a configured persistent one both
work. The checkpoint follows the commit: on a local disk the new metadata file is fsynced first (`sync`).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as pads
from dlt.common.destination.exceptions import DestinationUndefinedEntity
from dlt.common.libs.pyiceberg import create_table, ensure_iceberg_compatible_arrow_schema, evolve_table
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError, ResolveError
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.schema import promote
from pyiceberg.table import Table as IcebergTable

from ingestion_assets.loading.lake_tables import fsync_in, quoted
from ingestion_assets.loading.metadata_columns import DELETED_AT, POSITION

_CURRENT = "_ingest_table"  # the table's rows, as DuckDB sees them while a change is computed
_KEYS = "_ingest_keys"


@dataclass(frozen=True)
class IcebergTables:
    pipeline: Any  # the stream's dlt pipeline: its filesystem client holds the catalog and the credentials
    dataset_url: str
    local: bool

    def url(self, table: str) -> str:
        return f"{self.dataset_url}/{table}"

    def open(self, table: str) -> IcebergTable | None:
        """The table at its newest snapshot (a fresh client each time: an in-memory catalog would keep a stale
        registration of a table dlt has committed to since)."""
        with self.pipeline.destination_client() as client:
            catalog = client.get_open_table_catalog("iceberg")
            try:
                return evolve_table(catalog, client.fs_client, client.config, self._id(client, table), self.url(table))
            except (NoSuchTableError, DestinationUndefinedEntity):
                return None

    def dataset(self, table: str) -> Any:
        """The newest snapshot's rows as an Arrow dataset over its data files, scanned lazily (what reads it,
        DuckDB, pushes columns and filters down). Files with merge-on-read deletes (written by another engine:
        pyiceberg rewrites files) are read through pyiceberg's scan into memory instead, which applies them."""
        iceberg = self.open(table)
        if iceberg is None:
            return None
        tasks = list(iceberg.scan().plan_files())
        if any(task.delete_files for task in tasks) or not isinstance(iceberg.io, PyArrowFileIO):
            return pads.dataset(iceberg.scan().to_arrow())
        schema = iceberg.schema().as_arrow()
        if not tasks:
            return pads.dataset(schema.empty_table())
        located = [PyArrowFileIO.parse_location(task.file.file_path) for task in tasks]
        scheme, netloc, _ = located[0]
        filesystem = iceberg.io.fs_by_scheme(scheme, netloc)
        return pads.dataset([path for _, _, path in located], schema=schema, format="parquet", filesystem=filesystem)

    def has_rows(self, table: str) -> bool | None:
        iceberg = self.open(table)
        if iceberg is None:
            return None
        return iceberg.current_snapshot() is not None and iceberg.scan(limit=1).to_arrow().num_rows > 0

    def delete(self, table: str, predicate: str | None = None) -> None:
        iceberg = self.open(table)
        if iceberg is None:
            return
        if predicate is None:
            iceberg.delete(delete_filter=AlwaysTrue())
            self.sync(table)
            return
        self._rewrite(iceberg, table, f"SELECT * FROM {_CURRENT} t WHERE NOT coalesce(({predicate}), false)")

    def update(self, table: str, updates: dict[str, str], predicate: str) -> None:
        iceberg = self.open(table)
        if iceberg is not None:
            self._rewrite(iceberg, table, _update_sql(updates, predicate), _count(predicate))

    def retire_keys(self, table: str, keys: pa.Table, soft: bool) -> int:
        """Delete the rows of `keys`, or flag them deleted keeping their last values, in one snapshot."""
        iceberg = self.open(table)
        if iceberg is None or keys.num_rows == 0:
            return 0
        on = " AND ".join(f"k.{quoted(name)} = t.{quoted(name)}" for name in keys.column_names)
        matched = f"EXISTS (SELECT 1 FROM {_KEYS} k WHERE {on})"
        if soft:
            matched += f" AND t.{DELETED_AT} IS NULL"
            return self._rewrite(iceberg, table, _update_sql({DELETED_AT: "now()"}, matched), _count(matched), keys)
        return self._rewrite(iceberg, table, f"SELECT * FROM {_CURRENT} t WHERE NOT ({matched})", None, keys)

    def flag_deleted(self, table: str, key: tuple[str, ...], marks: pa.Table) -> int:
        """CDC's soft deletes (`marks`: the key typed as the rows landed _k0.., `_version`, `_at`): flag each row at
        the delete's version, keeping its values, unless it is flagged already or newer; one snapshot."""
        iceberg = self.open(table)
        if iceberg is None or marks.num_rows == 0:
            return 0
        on = " AND ".join(f"t.{quoted(k)} = m._k{i}" for i, k in enumerate(key))
        hit = f"m._k0 IS NOT NULL AND t.{DELETED_AT} IS NULL AND (t.{POSITION} IS NULL OR t.{POSITION} < m._version)"
        flagged = ", ".join(
            f"CASE WHEN {hit} THEN m.{new} ELSE t.{column} END AS {column}"
            for column, new in ((DELETED_AT, "_at"), (POSITION, "_version"))
        )
        select = f"SELECT t.* REPLACE ({flagged}) FROM {_CURRENT} t LEFT JOIN {_KEYS} m ON {on}"
        count = f"SELECT count(*) FROM {_CURRENT} t JOIN {_KEYS} m ON {on} WHERE {hit}"
        return self._rewrite(iceberg, table, select, count, marks)

    def overwrite_with(self, table: str, shadow: str) -> bool:
        """The refresh's swap: the shadow's rows become the table's in one commit (a delete and an append in
        one transaction; the older snapshots stay readable). False when there is no shadow."""
        source = self.open(shadow)
        if source is None:
            return False
        self.replace(table, source.scan().to_arrow())
        return True

    def replace(self, table: str, rows: pa.Table) -> None:
        """The table's rows and column types become `rows`' in one snapshot commit (a refresh's shadow retyped, or
        swapped in); a table not there yet is created first."""
        iceberg = self.open(table)
        if iceberg is None:
            with self.pipeline.destination_client() as client:
                catalog = client.get_open_table_catalog("iceberg")
                create_table(catalog, self._id(client, table), self.url(table), rows.schema)
            iceberg = self.open(table)
            assert iceberg is not None
        _overwrite_as(iceberg, rows)
        self.sync(table)

    def _rewrite(
        self, iceberg: IcebergTable, table: str, select: str, count: str | None = None, keys: pa.Table | None = None
    ) -> int:
        """The table's rows replaced by `select` over them, in one commit; how many rows changed (`count`, or how
        many went). Nothing is committed when no row changes."""
        current = iceberg.scan().to_arrow()
        with contextlib.closing(duckdb.connect()) as con:
            con.register(_CURRENT, current)
            if keys is not None:
                con.register(_KEYS, keys)
            result = con.sql(select).to_arrow_table()
            if count is None:
                changed = current.num_rows - result.num_rows
            else:
                found = con.execute(count).fetchone()
                changed = int(found[0]) if found else 0
        if changed:
            iceberg.overwrite(result.select(current.column_names).cast(current.schema))
            self.sync(table)
        return changed

    def lineage(self, table: str) -> str | None:
        """The current snapshot (id and sequence number): what a checkpoint records of the table."""
        iceberg = self.open(table)
        snapshot = None if iceberg is None else iceberg.current_snapshot()
        return None if snapshot is None else f"{snapshot.snapshot_id}:{snapshot.sequence_number}"

    def went_back(self, table: str, lineage: str) -> str | None:
        """Why the table no longer holds what snapshot `lineage` held (None: that snapshot is an ancestor of the
        current one, or expired below a newer one): a rollback, or the table made again."""
        iceberg = self.open(table)
        if iceberg is None:
            return None
        snapshot_id, sequence = (int(part) for part in lineage.split(":"))
        current = iceberg.current_snapshot()
        if current is None or (current.sequence_number or 0) < sequence:
            return f"its current snapshot is older than the checkpoint's ({snapshot_id}): rolled back or made again"
        known = {snap.snapshot_id: snap for snap in iceberg.metadata.snapshots}
        if snapshot_id not in known:
            return None  # expired: the current snapshot is newer, and nothing says it does not descend from it
        walk: Any = current
        while walk is not None:
            if walk.snapshot_id == snapshot_id:
                return None
            walk = known.get(walk.parent_snapshot_id) if walk.parent_snapshot_id is not None else None
        return f"its current snapshot {current.snapshot_id} does not descend from the checkpoint's {snapshot_id}"

    def prepare_columns(self, table: str, schema: pa.Schema) -> None:
        """Before a merge of a slice of `schema` (the target's names): pyiceberg's upsert reads the target's matched
        rows in the schema of the table's current snapshot, not in the table's current schema, so a slice bringing
        a new column and updating a key already there failed every run ("Target schema's field names are not
        matching the table's field names"), dlt having just added the column without a snapshot. The new columns
        are added here, and an empty snapshot (no file) makes the schema holding them the one the upsert reads
        in; also a table left with its schema ahead of its snapshot by such a failed run."""
        iceberg = self.open(table)
        snapshot = None if iceberg is None else iceberg.current_snapshot()
        if iceberg is None or snapshot is None:
            return
        wanted = ensure_iceberg_compatible_arrow_schema(schema)
        new = [name for name in wanted.names if name not in iceberg.schema().column_names]
        if not new and snapshot.schema_id == iceberg.metadata.current_schema_id:
            return
        with iceberg.transaction() as transaction:
            if new:
                with transaction.update_schema() as update:
                    update.union_by_name(pa.schema([wanted.field(name) for name in new]))
            with transaction.update_snapshot().fast_append():
                pass  # no file: a snapshot in the schema as it is now
        self.sync(table)

    def sync(self, table: str) -> None:
        """On a local disk, force the newest metadata file (the commit) and its folder to the device before the
        checkpoint counts on it; an object store's PUT is durable when it returns."""
        if not self.local:
            return
        folder = os.path.join(self.url(table).removeprefix("file://"), "metadata")
        if not os.path.isdir(folder):
            return
        fsync_in(folder, sorted(name for name in os.listdir(folder) if name.endswith(".metadata.json"))[-1:])

    @staticmethod
    def _id(client: Any, table: str) -> str:
        return f"{client.dataset_name}.{table}"


def _overwrite_as(iceberg: IcebergTable, rows: pa.Table) -> None:
    """`rows` become the table's, with their column types, in one commit. A column whose type Iceberg cannot
    promote to the new one (bigint to text after a refresh read a widening) is dropped and added again in its place:
    a new field id, so older snapshots still read their own values; other columns keep theirs (union by name)."""
    schema = ensure_iceberg_compatible_arrow_schema(rows.schema)
    wanted = Catalog._convert_schema_if_needed(schema)  # arrow -> Iceberg types, as pyiceberg converts them
    current = iceberg.schema()
    retyped = [
        field.name
        for field in wanted.fields
        if field.name in current.column_names and not _promotes(current.find_type(field.name), field.field_type)
    ]
    with iceberg.transaction() as transaction:
        if retyped:
            with transaction.update_schema() as update:
                for name in retyped:
                    update.delete_column(name)
        with transaction.update_schema() as update:
            update.union_by_name(schema)
            for name in retyped:  # back to its place: readers and pyiceberg's upsert match columns by position
                place = schema.names.index(name)
                update.move_first(name) if place == 0 else update.move_after(name, schema.names[place - 1])
        transaction.overwrite(rows.cast(schema))


def _promotes(old: Any, new: Any) -> bool:
    if old == new:
        return True
    try:
        promote(old, new)
    except ResolveError:
        return False
    return True


def _count(predicate: str) -> str:
    return f"SELECT count(*) FROM {_CURRENT} t WHERE {predicate}"


def _update_sql(updates: dict[str, str], predicate: str) -> str:
    replaced = ", ".join(
        f"CASE WHEN coalesce(({predicate}), false) THEN {expr} ELSE t.{quoted(column)} END AS {quoted(column)}"
        for column, expr in updates.items()
    )
    return f"SELECT * REPLACE ({replaced}) FROM {_CURRENT} t"
