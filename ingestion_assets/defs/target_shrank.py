"""A polled table stream's target holding fewer rows than the last run left in it: rows were deleted from it
behind the stream's runs (by hand, an older copy of the table restored; not `ingest reconcile --apply-deletes`,
which records what it removed and whose rows the source no longer holds). Their
cursors lie behind the checkpoint, where no window comparison looks: the run that finds it, counting before it
loads anything (rows it adds would hide the loss), compares the whole table and reads again by key what is missing."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import dagster as dg

from ingestion_assets.defs.metadata import ROW_COUNT, target_metadata
from ingestion_assets.state.checkpoints import CHECKPOINT_KEY
from ingestion_assets.state.runs import run_ended

if TYPE_CHECKING:
    from collections.abc import Callable

    from ingestion_assets.defs.streams import StreamRef
    from ingestion_assets.streams.runner import Stream

log = logging.getLogger(__name__)


REMOVED_BY_INGEST = "rows removed by ingest"  # an observation's figure: `ingest reconcile --apply-deletes` deleted them
# Beside a CDC run's row count: rows it found gone from the target outside ingest and could not put back (a CDC run
# has no comparison by key). The target should hold the count plus these: status keeps reporting them.
ROWS_MISSING = "rows missing"


def rows_expected(instance: dg.DagsterInstance, key: dg.AssetKey) -> int | None:
    """The target's row count as of the newest run that wrote the stream, less the rows ingest itself removed since
    (REMOVED_BY_INGEST): our own deletions are no loss (None: no run recorded one). That run's figure is its
    materialization's, or an observation's when the run wrote the stream without materializing it (a CDC run applies
    every stream's changes, whichever were selected)."""
    try:
        found = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key), limit=1, ascending=False)
        record = next(iter(found.records), None)
        event = record.asset_materialization if record is not None else None
        rows = _expected(event.metadata if event is not None else None)
        if record is not None and rows is None:
            return None  # the newest run that materialized the stream could not count its target
        counted, removed = _since(instance, key, record.storage_id if record is not None else 0)
        if counted is None and rows is None:
            return None
        return (counted if counted is not None else rows or 0) - removed
    except dg.DagsterError:
        return None


def _expected(metadata: Any) -> int | None:
    """The rows a run recorded its target should hold: its count, and the rows it found missing (ROWS_MISSING)."""
    value, missing = ((metadata or {}).get(k) for k in (ROW_COUNT, ROWS_MISSING))
    value, missing = getattr(value, "value", value), getattr(missing, "value", missing)
    if not isinstance(value, int):
        return None
    return int(value) + (int(missing) if isinstance(missing, int) else 0)


def _since(instance: dg.DagsterInstance, key: dg.AssetKey, storage_id: int) -> tuple[int | None, int]:
    """After the event `storage_id` (observations: checkpoints, row counts, operators' acts): the newest row count
    a run recorded, and the rows ingest recorded removing after it."""
    removed, cursor = 0, None
    records_filter = dg.AssetRecordsFilter(asset_key=key, after_storage_id=storage_id)
    while True:
        result = instance.fetch_observations(records_filter, limit=1000, cursor=cursor, ascending=False)
        for record in result.records:  # newest first
            metadata = record.asset_observation.metadata if record.asset_observation is not None else None
            counted = _expected(metadata)
            if counted is not None:
                return counted, removed
            value = (metadata or {}).get(REMOVED_BY_INGEST)
            value = getattr(value, "value", value)
            removed += value if isinstance(value, int) else 0
        if not result.has_more:
            return None, removed
        cursor = result.cursor


def uncounted_run(instance: dg.DagsterInstance, key: dg.AssetKey, run_id: str) -> str | None:
    """A finished run (not `run_id`) that committed slices of the stream after the newest row count recorded and
    never counted the target itself: killed (kill -9, the machine lost) between a slice's checkpoint and its end.
    What the target should hold is then not known: the count recorded is from before its slices (None: none)."""
    newest = _newest_count_id(instance, key)
    if newest is None:
        return None
    records_filter, cursor = dg.AssetRecordsFilter(asset_key=key, after_storage_id=newest), None
    while True:  # its checkpoints are observations; a materialization carries a count
        result = instance.fetch_observations(records_filter, limit=1000, cursor=cursor, ascending=False)
        for record in result.records:
            metadata = record.asset_observation.metadata if record.asset_observation is not None else {}
            entry = metadata.get(CHECKPOINT_KEY)
            details = entry.value if entry is not None and isinstance(entry.value, dict) else None
            if details is None or not record.run_id or record.run_id == run_id or details.get("position") is None:
                continue
            if "refresh" in details or (details.get("no_progress") or {}).get("attempts"):
                continue  # a refresh's shadow table, or a failure note (that attempt committed nothing)
            if run_ended(instance, record.run_id):
                return record.run_id
        if not result.has_more:
            return None
        cursor = result.cursor


def _newest_count_id(instance: dg.DagsterInstance, key: dg.AssetKey) -> int | None:
    """The storage id of the newest event that recorded the target's row count (a materialization or a run's
    observation); None: none did."""
    found = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key), limit=1, ascending=False)
    materialized = next(iter(found.records), None)
    after = materialized.storage_id if materialized is not None else 0
    records_filter, cursor = dg.AssetRecordsFilter(asset_key=key, after_storage_id=after), None
    while True:
        result = instance.fetch_observations(records_filter, limit=1000, cursor=cursor, ascending=False)
        for record in result.records:
            if record.asset_observation is not None and ROW_COUNT in record.asset_observation.metadata:
                return record.storage_id
        if not result.has_more:
            return materialized.storage_id if materialized is not None else None
        cursor = result.cursor


def target_shrank(context: dg.AssetExecutionContext, stream: Stream) -> str | None:
    """Why this run compares the whole table: the target lost rows since the last run, or a run killed after
    committing slices left no count to compare with (None: neither)."""
    killed = uncounted_run(context.instance, context.asset_key, context.run_id)
    if killed is not None:
        return (
            f"run {killed} committed slices and stopped without counting the target (killed): the rows it should "
            "hold are not known, so rows deleted from it since cannot be told by its count; this run compares the "
            "whole table (a time or key partition: its own) and reads the missing rows again by key"
        )
    before = rows_expected(context.instance, context.asset_key)
    if before is None:
        return None
    from ingestion_assets.observe.target import read_target

    try:
        now = read_target(stream.settings, stream.destination, stream.source_name, stream.name)
    except Exception as exc:  # noqa: BLE001 - a count to compare (pyiceberg raises its own): never fails the run
        log.warning("%s: could not count the target table before the run: %s", stream.qualified_name, exc)
        return None
    if not now.exists or now.rows is None or now.rows >= before:
        return None  # a table gone is the binding check's: the run reads everything again
    return (
        f"the target holds {now.rows:,} row(s), {before - now.rows:,} fewer than the last run left in it: rows were "
        "deleted from it outside the stream's runs (by hand, or an older copy restored); this run compares the whole "
        "table (a time or key partition: its own) and reads the missing rows again by key"
    )


def observe_target_rows(
    log_event: Callable[[dg.AssetObservation], None],
    key: dg.AssetKey,
    stream: StreamRef | Stream,
    partition: str | None,
    missing: int = 0,
) -> None:
    """The target's row count now, as an observation `rows_expected` takes over the last materialization's: for a
    run that wrote the stream without materializing it (a CDC run's unselected streams, a run that committed slices
    and then failed or drained). `missing`: rows the run found gone from the target and did not put back, kept
    beside the count. Nothing when the target cannot be counted (a warning says so)."""
    rows = target_metadata(stream, step_timing=False).get(ROW_COUNT)
    if isinstance(rows, int):
        metadata = {ROW_COUNT: rows, **({ROWS_MISSING: missing} if missing else {})}
        log_event(dg.AssetObservation(asset_key=key, partition=partition, metadata=metadata))
