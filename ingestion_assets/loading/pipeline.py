"""One dlt pipeline per stream run: it loads slice after slice and runs stateless."""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass, field
from typing import Any

import dlt
import pyarrow as pa
from dlt.destinations.exceptions import DatabaseUndefinedRelation

from ingestion_assets.catalog import Destination
from ingestion_assets.loading.destinations import make_destination, writer_lock
from ingestion_assets.loading.metadata_columns import DLT_HINTS, GENERATION
from ingestion_assets.loading.versions import check_keys
from ingestion_assets.settings import Settings

log = logging.getLogger(__name__)


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

    def column_hints(self) -> dict[str, dict[str, Any]]:
        hints: dict[str, dict[str, Any]] = {name: dict(hint) for name, hint in self.type_hints}
        for name in self.primary_key:
            hints[name] = {**hints.get(name, {}), "nullable": False, "primary_key": True}
        hints.update(DLT_HINTS)
        return hints


@dataclass
class Loader:
    """Loads Arrow slices into one target table; each `load` returns only after the commit."""

    settings: Settings
    destination: Destination
    target: TargetTable
    pipeline_name: str
    guard_versions: bool = False  # several writers (partitions, live tail): keep the newest version
    stream_table: str | None = None  # the stream's table when `target` is a refresh's shadow of it
    _pipeline: Any = field(default=None, init=False, repr=False)
    _loads: int = field(default=0, init=False)
    _append_only: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        logging.getLogger("dlt").addFilter(_HINT_NOTICE)  # a set: adding it again changes nothing
        # Loaded packages are not kept (a slice is re-read from the source, never from local files), and
        # the staging copy of a merged slice is emptied: neither disk grows with the number of runs.
        dlt.config["load.delete_completed_jobs"] = True
        dlt.config["load.truncate_staging_dataset"] = True
        self._pipeline = dlt.pipeline(
            pipeline_name=self.pipeline_name,
            pipelines_dir=str(self.settings.dlt_dir),
            destination=make_destination(self.settings, self.destination),
            dataset_name=self.target.dataset,
        )
        # The checkpoint in Dagster is the truth: packages a killed run left behind are stale re-reads.
        self._pipeline.abort_packages()

    def use_initial_load_path(self) -> bool:
        """Merge as a plain append when no row of this run can already be in the target.

        Sound only for a run that reads from the very start into an empty target in one snapshot, with
        no other writer: every key then arrives once. A crash moves the next run onto the merge path
        (it has a checkpoint, or the target is no longer empty).
        """
        if self.target.write_disposition == "merge" and not self.guard_versions and self.target_is_empty():
            self._append_only = True
        return self._append_only

    def target_is_empty(self) -> bool:
        with self._lock(), self._pipeline.sql_client() as client:
            try:
                return not client.execute_sql(
                    f"SELECT 1 FROM {client.make_qualified_table_name(self.target.table)} LIMIT 1"
                )
            except DatabaseUndefinedRelation:
                return True

    def max_generation(self, table: str) -> int | None:
        """The generation a table holds (None: no such table, or empty)."""
        with self._lock(), self._pipeline.sql_client() as client:
            try:
                rows = client.execute_sql(f"SELECT max({GENERATION}) FROM {client.make_qualified_table_name(table)}")
            except DatabaseUndefinedRelation:
                return None
        return int(rows[0][0]) if rows and rows[0][0] is not None else None

    def load(self, table: pa.Table) -> int:
        """Load one slice; returns how many rows went in (stale versions are left out)."""
        disposition = self.target.write_disposition
        if disposition == "replace" and self._loads > 0:
            disposition = "append"  # one run replaces once, then adds its later slices
        if self._append_only:
            disposition = "append"
        with self._lock():
            if self.guard_versions:
                with self._pipeline.sql_client() as client:
                    check = check_keys(client, self.destination.type, self.target.table, self.target.primary_key, table)
                table = check.rows
                if check.existing == 0 and disposition == "merge":
                    disposition = "append"  # none of its keys is there yet and no one else writes now
            if table.num_rows:
                hints: dict[str, Any] = {
                    "name": self.target.table,
                    "table_name": self.target.table,
                    "write_disposition": disposition,
                    "primary_key": list(self.target.primary_key),
                    "columns": self.target.column_hints(),
                }
                self._pipeline.run(dlt.resource([table], **hints), loader_file_format="parquet")
        self._loads += 1
        # dlt's config resolution leaves exception tracebacks in reference cycles whose frames still see
        # the slice; without a collection per slice, several slices stay alive and memory climbs.
        gc.collect()
        return int(table.num_rows)

    def swap_in(self, shadow: str, table: str) -> None:
        """Replace `table` by `shadow` in one transaction: readers see the old or the new generation."""
        with self._lock(), self._pipeline.sql_client() as client:
            target = client.make_qualified_table_name(table)
            source = client.make_qualified_table_name(shadow)
            with client.begin_transaction():
                client.execute_sql(f"DROP TABLE IF EXISTS {target}")
                client.execute_sql(f"ALTER TABLE {source} RENAME TO {client.escape_column_name(table)}")
        # The shadow had a pipeline (and dlt schema) of its own, named after it; its table is gone now, so
        # its local working folder goes too. Each generation's shadow has a new name: no schema expects it.
        self._pipeline.drop()

    def _lock(self) -> Any:
        table = self.stream_table or self.target.table
        return writer_lock(self.settings, self.destination, self.target.dataset, table)


def pipeline_name(source: str, stream: str, partition: str | None) -> str:
    suffix = "" if partition is None else "__" + "".join(ch if ch.isalnum() else "_" for ch in partition)
    return f"ingest__{source}__{stream}{suffix}"
