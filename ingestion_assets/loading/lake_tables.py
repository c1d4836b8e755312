"""Delta tables of a lake destination, opened with deltalake directly: what dlt's filesystem client cannot do.

dlt writes the stream's rows (merge = a Delta MERGE on the key); reading what a table holds, deleting rows,
swapping a refresh in and recording the binding need no SQL engine here (dlt's SQL view of a lake needs
DuckDB's delta extension, which a machine without internet cannot install).
"""

from __future__ import annotations

import datetime as dt
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from dlt.common.libs.deltalake import deltalake_storage_options

from ingestion_assets.loading.bindings import TABLE as BINDINGS
from ingestion_assets.loading.bindings import Marker
from ingestion_assets.loading.metadata_columns import DELETED_AT, POSITION

_BINDINGS_SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string(), nullable=False),
        pa.field("partition_key", pa.string(), nullable=False),
        pa.field("binding", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("generation", pa.int64(), nullable=False),
        pa.field("updated_at", pa.timestamp("us", "UTC"), nullable=False),
    ]
)


class TableStore(Protocol):
    """A lake's stream tables in one table format: what the loader reads and changes there (predicates and
    update expressions are SQL, as DataFusion and DuckDB read them)."""

    def dataset(self, table: str) -> Any: ...
    def has_rows(self, table: str) -> bool | None: ...
    def delete(self, table: str, predicate: str | None = None) -> None: ...
    def update(self, table: str, updates: dict[str, str], predicate: str) -> None: ...
    def retire_keys(self, table: str, keys: pa.Table, soft: bool) -> int: ...
    def flag_deleted(self, table: str, key: tuple[str, ...], marks: pa.Table) -> int: ...
    def overwrite_with(self, table: str, shadow: str) -> bool: ...
    def replace(self, table: str, rows: pa.Table) -> None: ...
    def sync(self, table: str) -> None: ...
    def prepare_columns(self, table: str, schema: pa.Schema) -> None: ...
    def lineage(self, table: str) -> str | None: ...
    def went_back(self, table: str, lineage: str) -> str | None: ...


@dataclass(frozen=True)
class LakeTables:
    """The dataset's folder in the lake and how to reach it (object-store options from dlt's credentials)."""

    dataset_url: str
    storage_options: dict[str, str]
    local: bool

    @classmethod
    def of(cls, pipeline: Any) -> LakeTables:
        with pipeline.destination_client() as client:
            url = client.make_remote_url(client.dataset_path)
            options = deltalake_storage_options(client.config.credentials, client.config.deltalake_storage_options)
            return cls(url.rstrip("/"), dict(options), bool(client.config.is_local_filesystem))

    def url(self, table: str) -> str:
        return f"{self.dataset_url}/{table}"

    def stream_tables(self, pipeline: Any, table_format: str) -> TableStore:
        """The stream tables' store in the destination's table format (what loads them and what counts them must
        read the same format: Iceberg and plain Parquet folders are no Delta tables)."""
        if table_format == "iceberg":
            from ingestion_assets.loading.iceberg import IcebergTables  # pyiceberg loads only for Iceberg

            return IcebergTables(pipeline, self.dataset_url, self.local)
        if table_format == "parquet":
            from ingestion_assets.loading.lake_parquet import ParquetFiles

            return ParquetFiles(pipeline)
        return self

    def open(self, table: str) -> DeltaTable | None:
        try:
            return DeltaTable(self.url(table), storage_options=self.storage_options)
        except TableNotFoundError:
            return None

    def dataset(self, table: str) -> Any:
        """The newest version's rows as an Arrow dataset, scanned lazily (None: no such table)."""
        delta = self.open(table)
        return None if delta is None else delta.to_pyarrow_dataset()

    def has_rows(self, table: str) -> bool | None:
        """None: no such table."""
        delta = self.open(table)
        if delta is None:
            return None
        return any(batch.num_rows for batch in delta.to_pyarrow_dataset().to_batches(columns=[]))

    def read_marker(self, stream: str, partition: str | None) -> Marker | None:
        delta = self.open(BINDINGS)
        if delta is None:
            return None
        rows = delta.to_pyarrow_table().to_pylist()
        found = [r for r in rows if r["stream"] == stream and r["partition_key"] == (partition or "")]
        return Marker(found[0]["binding"], int(found[0]["seq"]), int(found[0]["generation"])) if found else None

    def write_marker(self, stream: str, partition: str | None, marker: Marker) -> None:
        """One Delta commit: merged on (stream, partition_key); durable when this returns (see `sync`)."""
        row = {
            "stream": [stream],
            "partition_key": [partition or ""],
            "binding": [marker.binding],
            "seq": [marker.seq],
            "generation": [marker.generation],
            "updated_at": [dt.datetime.now(dt.UTC)],
        }
        source = pa.table(row, schema=_BINDINGS_SCHEMA)

        def commit() -> None:
            delta = self.open(BINDINGS)
            if delta is None:
                write_deltalake(self.url(BINDINGS), source, storage_options=self.storage_options)
            else:
                predicate = "t.stream = s.stream AND t.partition_key = s.partition_key"
                merge = delta.merge(source, predicate, source_alias="s", target_alias="t")
                merge.when_matched_update_all().when_not_matched_insert_all().execute()

        _retry_conflicts(commit)
        self.sync(BINDINGS)

    def set_generation(self, stream: str, generation: int) -> None:
        def commit() -> bool:
            delta = self.open(BINDINGS)
            if delta is not None:
                delta.update(updates={"generation": str(int(generation))}, predicate=f"stream = {_literal(stream)}")
            return delta is not None

        if _retry_conflicts(commit):
            self.sync(BINDINGS)

    def delete(self, table: str, predicate: str | None = None) -> None:
        """Also on the tables streams share (dead letters): a concurrent commit is retried."""

        def commit() -> bool:
            delta = self.open(table)
            if delta is not None:
                delta.delete(predicate)
            return delta is not None

        if _retry_conflicts(commit):
            self.sync(table)

    def update(self, table: str, updates: dict[str, str], predicate: str) -> None:
        def commit() -> bool:
            delta = self.open(table)
            if delta is not None:
                delta.update(updates=updates, predicate=predicate)
            return delta is not None

        if _retry_conflicts(commit):
            self.sync(table)

    def prepare_columns(self, table: str, schema: pa.Schema) -> None:
        """Nothing before a merge: Delta's MERGE (with schema evolution) takes a slice's new columns itself."""

    def retire_keys(self, table: str, keys: pa.Table, soft: bool) -> int:
        """Delete the rows of `keys` (the key columns), or flag them deleted keeping their last values, in one
        Delta MERGE; returns how many rows it changed."""
        delta = self.open(table)
        if delta is None or keys.num_rows == 0:
            return 0
        on = " AND ".join(f"t.{quoted(k)} = s.{quoted(k)}" for k in keys.column_names)
        merge = delta.merge(keys, on, source_alias="s", target_alias="t")
        if soft:
            merge = merge.when_matched_update({DELETED_AT: "now()"}, predicate=f"t.{DELETED_AT} IS NULL")
        else:
            merge = merge.when_matched_delete()
        metrics = merge.execute()
        self.sync(table)
        return int(metrics.get("num_target_rows_updated" if soft else "num_target_rows_deleted", 0))

    def flag_deleted(self, table: str, key: tuple[str, ...], marks: pa.Table) -> int:
        """CDC's soft deletes (`marks`: the key typed as the rows landed _k0.., `_version`, `_at`): flag each row at
        the delete's version, keeping its values, unless it is flagged already or newer; one Delta MERGE."""
        delta = self.open(table)
        if delta is None or marks.num_rows == 0:
            return 0
        on = " AND ".join(f"t.{quoted(k)} = s._k{i}" for i, k in enumerate(key))
        newer = f"t.{DELETED_AT} IS NULL AND (t.{POSITION} IS NULL OR t.{POSITION} < s._version)"
        merge = delta.merge(marks, on, source_alias="s", target_alias="t")
        metrics = merge.when_matched_update({DELETED_AT: "s._at", POSITION: "s._version"}, predicate=newer).execute()
        self.sync(table)
        return int(metrics.get("num_target_rows_updated", 0))

    def overwrite_with(self, table: str, shadow: str) -> bool:
        """The refresh's swap: the shadow's rows become the table's in one Delta commit (readers see the old
        or the new version; time travel keeps the old one). False when there is no shadow."""
        source = self.open(shadow)
        if source is None:
            return False
        reader = source.to_pyarrow_dataset().scanner().to_reader()
        write_deltalake(
            self.url(table), reader, mode="overwrite", schema_mode="overwrite", storage_options=self.storage_options
        )
        self.sync(table)
        return True

    def replace(self, table: str, rows: pa.Table) -> None:
        """The table's rows and column types become `rows`' in one Delta commit (a refresh's shadow retyped)."""
        write_deltalake(
            self.url(table), rows, mode="overwrite", schema_mode="overwrite", storage_options=self.storage_options
        )
        self.sync(table)

    def lineage(self, table: str) -> str | None:
        """The table's version: what a checkpoint records of it, to notice the table taken back later."""
        delta = self.open(table)
        return None if delta is None else str(delta.version())

    def went_back(self, table: str, lineage: str) -> str | None:
        """Why the table no longer holds what it held at version `lineage` (None: it does, whatever was
        appended, merged, compacted or vacuumed since): an older log (the table made again), or a RESTORE since."""
        delta = self.open(table)
        if delta is None:
            return None
        recorded, now = int(lineage), delta.version()
        if now < recorded:
            return f"its Delta log is at version {now}, older than the checkpoint's {recorded} (the table made again)"
        for commit in delta.history(now - recorded) if now > recorded else []:
            if int(commit.get("version", -1)) > recorded and str(commit.get("operation", "")).upper() == "RESTORE":
                return (
                    f"its Delta version {commit['version']} restored it to an earlier version "
                    f"({commit.get('operationParameters', {})}) after the checkpoint's version {recorded}"
                )
        return None

    def sync(self, table: str) -> None:
        """On a local disk, force the Delta log to the device: an object store's PUT is durable when it
        returns, a local rename is not until the directory is flushed (a power cut could lose the commit
        that a checkpoint written right after it already counts)."""
        if not self.local:
            return
        log_dir = os.path.join(self.url(table).removeprefix("file://"), "_delta_log")
        fsync_in(log_dir, newest_commits(os.listdir(log_dir)))


SYNCED_COMMITS = 32


def newest_commits(names: list[str]) -> list[str]:
    """The Delta log's newest commit files (`<20-digit version>.json`), never a writer's temporary file or
    `_last_checkpoint` (they sort after the commits by name; a temporary file is renamed away under a concurrent
    writer). Streams sharing a table (bindings, dead letters) commit between this one's commit and its sync:
    the newest few are forced, each already on the device costs next to nothing."""
    commits = [name for name in names if name.endswith(".json") and name[:-5].isdigit()]
    return sorted(commits, key=lambda name: int(name[:-5]))[-SYNCED_COMMITS:]


def fsync_in(folder: str, names: list[str]) -> None:
    """Force the named files of `folder`, then the folder itself (so a rename into it survives a power cut)."""
    for name in names:
        try:
            with open(os.path.join(folder, name), "rb") as handle:
                os.fsync(handle.fileno())
        except FileNotFoundError:  # removed meanwhile (an old commit's log cleanup): nothing left to force
            continue
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def quoted(name: str) -> str:
    """A double-quoted identifier, as DataFusion (deltalake) and DuckDB read it."""
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


CONFLICT_ATTEMPTS = 20


def _retry_conflicts(commit: Callable[[], Any]) -> Any:
    """A commit to a Delta table every stream of the dataset shares (bindings, dead letters) against its newest
    version: a concurrent commit of another stream (a conflict, or the table created meanwhile) is no error of
    this one, so it is read again and committed again after a short random wait."""
    for attempt in range(CONFLICT_ATTEMPTS):
        try:
            return commit()
        except (CommitFailedError, DeltaError) as exc:
            conflict = isinstance(exc, CommitFailedError) or "already exists" in str(exc)
            if not conflict or attempt == CONFLICT_ATTEMPTS - 1:
                raise
            time.sleep(random.uniform(0.01, 0.05 * (attempt + 1)))
    return None
