"""A PostgreSQL table stream: keyset read from its checkpoint, merge into the target, checkpoint per slice."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ingestion_assets.catalog import Destination, PostgresSource, PostgresStream
from ingestion_assets.loading.metadata_columns import with_metadata
from ingestion_assets.loading.pipeline import Loader, TargetTable, pipeline_name
from ingestion_assets.partitions import UnknownPartition, window_for
from ingestion_assets.references import resolve
from ingestion_assets.settings import Settings
from ingestion_assets.sources.postgres import plan_table_read, table_slices
from ingestion_assets.sources.postgres.query import ReadPlan
from ingestion_assets.sources.slices import Slice
from ingestion_assets.sync import CheckpointSink, Faults, SyncResult, run_slices


class StreamError(RuntimeError):
    """A stream cannot run; the message starts with the stream's name."""


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

    def resume_position(self, position: dict[str, Any] | None, complete: bool) -> dict[str, Any] | None:
        """Where the next run starts: after the checkpoint; a cursor-less stream re-reads once complete."""
        if not self.spec.cursor and complete:
            return None
        return position

    def loader(self, target: Target, partition: str | None) -> Loader:
        plan = self.plan()
        return Loader(
            settings=self.settings,
            destination=self.destination,
            target=TargetTable(
                dataset=self.source_name,
                table=target.table,
                primary_key=tuple(self.spec.primary_key),
                write_disposition="merge" if target.stream_table else self.spec.write_disposition,
                type_hints=tuple((c.name, h) for c in plan.shape.columns if (h := c.dlt_hint()) is not None),
            ),
            pipeline_name=pipeline_name(self.source_name, target.table, partition),
            guard_versions=self.spec.partitions is not None,
            stream_table=target.stream_table,
        )

    def source_url(self) -> str:
        return resolve(self.source.connection, self.settings, f"sources.{self.source_name}.connection")

    def plan(self) -> ReadPlan:
        try:
            return plan_table_read(
                self.source_url(),
                self.spec.schema_name,
                self.spec.table_name,
                tuple(self.spec.cursor),
                tuple(self.spec.primary_key),
            )
        except LookupError as exc:
            raise StreamError(f"stream {self.qualified_name}: {exc}") from exc

    def run(
        self,
        after: dict[str, Any] | None,
        sink: CheckpointSink,
        target: Target | None = None,
        partition: str | None = None,
        stop: Callable[[], bool] | None = None,
        faults: Faults | None = None,
        log: logging.Logger | None = None,
        loader: Loader | None = None,
    ) -> SyncResult:
        """Read the partition's window after `after` and load it into `target`, checkpointing each slice."""
        target = target or Target(self.name, generation=1)
        try:
            window = window_for(self.spec, partition)
        except UnknownPartition as exc:
            raise StreamError(f"stream {self.qualified_name}: {exc}") from exc
        plan = self.plan()
        loader = loader or self.loader(target, partition)
        if after is None and window is None and loader.use_initial_load_path() and log is not None:
            log.info("%s: empty target, first full read: loading slices by append", self.qualified_name)

        def load(piece: Slice) -> None:
            now = dt.datetime.now(dt.UTC)
            loader.load(with_metadata(piece.table, self.spec.cursor, now, generation=target.generation))

        slices = table_slices(self.source_url(), plan, after, self.spec.slice_rows, self.qualified_name, window)
        return run_slices(
            slices, load, sink, started_from=after, faults=faults or Faults.from_env(), log=log, stop=stop
        )


@dataclass(frozen=True)
class Target:
    """The table a run writes and the generation its rows carry."""

    table: str
    generation: int
    stream_table: str | None = None  # set when `table` is a refresh's shadow of this stream table
