"""One batch of the log into the streams' targets: every table's changes of the batch in ONE load where the
destination takes one (DuckDB: loading/duckdb_batch.py), else one load per table (PostgreSQL, lakes, other
SQL); then each change's commit-to-target latency into the run's histogram."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from ingestion_assets.loading.duckdb_batch import TableSlice, batch_loadable, load_tables
from ingestion_assets.loading.parked import release_parked
from ingestion_assets.observe.commit_latency import record_counts
from ingestion_assets.partitions import LIVE
from ingestion_assets.sources.postgres.cdc import CdcError
from ingestion_assets.sources.postgres.introspect import TableShape
from ingestion_assets.streams.cdc.rows import (
    TableChanges,
    dead_letter_table,
    log_key_text,
    mark_deleted,
)
from ingestion_assets.streams.target_types import fit_shape

if TYPE_CHECKING:
    from ingestion_assets.loading.pipeline import Loader
    from ingestion_assets.streams.cdc.sync import CdcOutcome, CdcSync
    from ingestion_assets.streams.postgres_table import PostgresTableStream


@dataclass
class LogLoads:
    """What one run's batches share: each stream's shape as its target holds it, fitted at the first batch
    (asking the target per batch cost a connection and a catalog query each time)."""

    fitted: dict[str, tuple[TableShape, TableShape]] = field(default_factory=dict)  # stream -> (given, fitted)

    def fit(self, name: str, shape: TableShape, loader: Loader) -> TableShape:
        known = self.fitted.get(name)
        if known is not None and known[0] is shape:
            return known[1]
        fitted = fit_shape(shape, loader)
        self.fitted[name] = (shape, fitted)
        return fitted


def load_changes(sync: CdcSync, pending: dict[str, TableChanges], outcome: CdcOutcome) -> None:
    """Load the batch's changes (`pending`: per stream) and count them; returns after every commit."""
    ordered = [(stream, pending[stream.name]) for stream in sync.streams if stream.name in pending]
    sync.loading = [stream.qualified_name for stream, _ in ordered]
    for stream, changes in ordered:
        changes.shape = sync._loads.fit(stream.name, changes.shape, sync._parts(stream).loader)
    together = [(s, c) for s, c in ordered if batch_loadable(sync._parts(s).loader)]
    if together:
        slices = [_slice(sync, stream, changes) for stream, changes in together]
        for (stream, changes), done in zip(together, load_tables(slices), strict=True):
            parts = sync._parts(stream)
            if done.has_rows is not None:
                parts.empty = not done.has_rows
            elif changes.rows:
                parts.empty = False
        committed = dt.datetime.now(dt.UTC)
        for stream, changes in together:
            _count(outcome, stream, changes, committed)
    for stream, changes in ordered:
        if not batch_loadable(sync._parts(stream).loader):
            _load_one(sync, stream, changes)
            _count(outcome, stream, changes, dt.datetime.now(dt.UTC))
            outcome.dead_letters += sync._parts(stream).loader.take_parked()  # values the target cannot hold
    for stream, changes in ordered:
        release_logged_keys(sync._parts(stream).loader, changes)
    sync.loading = []


def release_logged_keys(loader: Loader, changes: TableChanges) -> None:
    """Dead letters a CDC stream parked before keys had one text (under the log's text of the key, e.g.
    `2024-01-01 00:00:00+00`, which the load's `record_keys` never spells) leave when a change of their key
    loads, as the others do. Asked only of the keys the loader already knows to be parked."""
    parked = loader._parked_keys
    if not parked or not changes.rows:
        return
    logged = {log_key_text(row, changes.primary_key) for row in changes.rows} & parked
    if logged:
        release_parked(loader, sorted(logged))


def _slice(sync: CdcSync, stream: PostgresTableStream, changes: TableChanges) -> TableSlice:
    loader = sync._parts(stream).loader
    rows = _rows(stream, changes)  # before the dead letters: a value that does not fit moves there
    return TableSlice(
        loader,
        rows=rows,
        dead_letters=dead_letter_table(stream, changes, sync.run_id),
        marks=marks_table(changes, loader.key),
        truncate=changes.truncated_at is not None,
        hard_deletes=stream.spec.deletes == "hard",
    )


def _rows(stream: PostgresTableStream, changes: TableChanges) -> pa.Table | None:
    """The changes as typed rows; a value the parse of the table's current types cannot read stops the run
    naming the stream (the error of Arrow's CSV reader names a column number only)."""
    try:
        return changes.to_arrow(generation=1)
    except pa.ArrowInvalid as exc:
        name = stream.qualified_name
        raise CdcError(
            f"stream {name}: a change from the log cannot be read as the table's column types "
            f"({', '.join(f'{c.name} {c.sql_type}' for c in changes.shape.columns)}): {exc}. A column's type changed "
            f"after the run started: the next run compares the columns and copies the table again (`ingest schema "
            f"show {name}` shows the change); this batch was not checkpointed: that run reads it again"
        ) from exc


def marks_table(changes: TableChanges, key: tuple[str, ...]) -> pa.Table | None:
    """The soft-delete marks as rows: each key column typed as the rows land, named as the target names it."""
    marks = changes.marks_table()
    if marks is None:
        return None
    return marks.rename_columns([*key, *marks.column_names[len(key) :]])


def _load_one(sync: CdcSync, stream: PostgresTableStream, changes: TableChanges) -> None:
    """One table's changes through `Loader.load` (a destination without a batch load)."""
    parts = sync._parts(stream)
    loader = parts.loader
    if changes.truncated_at is not None:
        loader.delete_all()
    rows = _rows(stream, changes)
    dead = dead_letter_table(stream, changes, sync.run_id)
    if rows is not None or dead is not None:
        loader.load(rows, dead_letters=dead)
    mark_deleted(loader, marks_table(changes, loader.key))
    if stream.spec.deletes == "hard":
        loader.purge_deleted()
    if changes.truncated_at is not None or (stream.spec.deletes == "hard" and changes.marks):  # emptied?
        parts.empty = not loader.inspect(LIVE if sync.history else None).has_rows
    elif rows is not None:
        parts.empty = False


def _count(outcome: CdcOutcome, stream: PostgresTableStream, changes: TableChanges, committed: dt.datetime) -> None:
    if changes.commit_times:
        waited = [(committed - t) // dt.timedelta(milliseconds=1) for t in changes.commit_times]
        record_counts(outcome.histogram, pa.array(waited, pa.int64()))
    outcome.rows[stream.name] = outcome.rows.get(stream.name, 0) + len(changes.rows) + len(changes.marks)
    if changes.truncated_at is not None:
        outcome.truncated.add(stream.name)
    outcome.dead_letters += len(changes.bad)
