"""A polled table stream's target holding fewer rows than the last run left in it: rows were deleted from it
behind the stream's runs (by hand, an older copy of the table restored; not `ingest reconcile --apply-deletes`,
which records what it removed and whose rows the source no longer holds). Their
cursors lie behind the checkpoint, where no window comparison looks: the run that finds it, counting before it
loads anything (rows it adds would hide the loss), compares the whole table and reads again by key what is missing."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import dagster as dg

from ingestion_assets.defs.metadata import ROW_COUNT

if TYPE_CHECKING:
    from ingestion_assets.streams.runner import Stream

log = logging.getLogger(__name__)


REMOVED_BY_INGEST = "rows removed by ingest"  # an observation's figure: `ingest reconcile --apply-deletes` deleted them


def rows_expected(instance: dg.DagsterInstance, key: dg.AssetKey) -> int | None:
    """The target's row count the stream's newest materialization recorded, less the rows ingest itself removed
    since (REMOVED_BY_INGEST): our own deletions are no loss (None: no materialization, or it could not count)."""
    try:
        found = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key), limit=1, ascending=False)
        record = next(iter(found.records), None)
        event = record.asset_materialization if record is not None else None
        value = (event.metadata or {}).get(ROW_COUNT) if event is not None else None
        rows = getattr(value, "value", value)
        if record is None or not isinstance(rows, int):
            return None
        return int(rows) - _removed_since(instance, key, record.storage_id)
    except dg.DagsterError:
        return None


def _removed_since(instance: dg.DagsterInstance, key: dg.AssetKey, storage_id: int) -> int:
    """The rows ingest recorded removing after the event `storage_id` (observations: checkpoints, operators' acts)."""
    removed, cursor = 0, None
    records_filter = dg.AssetRecordsFilter(asset_key=key, after_storage_id=storage_id)
    while True:
        result = instance.fetch_observations(records_filter, limit=1000, cursor=cursor, ascending=False)
        for record in result.records:
            observation = record.asset_observation
            value = (observation.metadata or {}).get(REMOVED_BY_INGEST) if observation is not None else None
            value = getattr(value, "value", value)
            removed += value if isinstance(value, int) else 0
        if not result.has_more:
            return removed
        cursor = result.cursor


def target_shrank(context: dg.AssetExecutionContext, stream: Stream) -> str | None:
    """Why this run compares the whole table: the target lost rows since the last run (None: it did not)."""
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
