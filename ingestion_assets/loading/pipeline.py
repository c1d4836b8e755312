"""One dlt pipeline per stream run: it loads slice after slice and runs stateless."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dlt
import pyarrow as pa
from dlt.common.destination.reference import Destination as DltDestination
from dlt.destinations.exceptions import DatabaseUndefinedRelation
from dlt.destinations.impl.duckdb.configuration import DuckDbCredentials

from ingestion_assets.catalog import Destination
from ingestion_assets.loading.metadata_columns import DLT_HINTS
from ingestion_assets.references import resolve
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
    table: str  # the stream name
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

        Sound only for a run that reads from the very start into an empty target in one snapshot:
        every key then arrives once. A crash moves the next run onto the merge path (it has a
        checkpoint, or the target is no longer empty).
        """
        if self.target.write_disposition == "merge" and self.target_is_empty():
            self._append_only = True
        return self._append_only

    def target_is_empty(self) -> bool:
        with self._destination_lock(), self._pipeline.sql_client() as client:
            table = client.make_qualified_table_name(self.target.table)
            try:
                return not client.execute_sql(f"SELECT 1 FROM {table} LIMIT 1")
            except DatabaseUndefinedRelation:
                return True

    def load(self, table: pa.Table) -> None:
        disposition = self.target.write_disposition
        if disposition == "replace" and self._loads > 0:
            disposition = "append"  # one run replaces once, then adds its later slices
        if self._append_only:
            disposition = "append"
        hints: dict[str, Any] = {
            "name": self.target.table,
            "table_name": self.target.table,
            "write_disposition": disposition,
            "primary_key": list(self.target.primary_key),
            "columns": self.target.column_hints(),
        }
        resource = dlt.resource([table], **hints)
        with self._destination_lock():
            self._pipeline.run(resource, loader_file_format="parquet")
        self._loads += 1
        # dlt's config resolution leaves exception tracebacks in reference cycles whose frames still see
        # the slice; without a collection per slice, several slices stay alive and memory climbs.
        gc.collect()

    @contextlib.contextmanager
    def _destination_lock(self) -> Iterator[None]:
        """DuckDB admits one writing process: loads from parallel runs take turns; extraction does not."""
        if self.destination.type != "duckdb":
            yield
            return
        path = duckdb_path(self.settings, self.destination)
        path.parent.mkdir(parents=True, exist_ok=True)
        with Path(f"{path}.lock").open("w") as handle:
            started = time.monotonic()
            fcntl.flock(handle, fcntl.LOCK_EX)
            waited = time.monotonic() - started
            if waited > 1:
                log.info("waited %.1fs for the DuckDB writer lock on %s", waited, path)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def duckdb_path(settings: Settings, destination: Destination) -> Path:
    return Path(destination.path).expanduser() if destination.path else settings.warehouse_path


def make_destination(settings: Settings, destination: Destination) -> DltDestination[Any, Any]:
    if destination.type == "duckdb":
        path = duckdb_path(settings, destination)
        path.parent.mkdir(parents=True, exist_ok=True)
        # DuckDB caches up to 80% of RAM by default: a loader's memory would then grow with the table.
        credentials = DuckDbCredentials(str(path), global_config={"memory_limit": destination.memory_limit})
        return dlt.destinations.duckdb(credentials)
    assert destination.credentials is not None
    url = resolve(destination.credentials, settings, "destination.credentials")
    return dlt.destinations.postgres(credentials=url)


def pipeline_name(source: str, stream: str, partition: str | None) -> str:
    suffix = "" if partition is None else "__" + "".join(ch if ch.isalnum() else "_" for ch in partition)
    return f"ingest__{source}__{stream}{suffix}"
