"""A polled table stream's target holding fewer rows than the last run left in it: rows were deleted from it
behind the stream's runs (by hand, an older copy of the table restored, `ingest reconcile --apply-deletes`). Their
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


def rows_left_by_last_run(context: dg.AssetExecutionContext) -> int | None:
    """The target's row count the stream's newest materialization recorded (None: none, or it could not count)."""
    try:
        found = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=context.asset_key), limit=1, ascending=False
        )
    except dg.DagsterError:
        return None
    for record in found.records:
        event = record.asset_materialization
        value = (event.metadata or {}).get(ROW_COUNT) if event is not None else None
        rows = getattr(value, "value", value)
        return int(rows) if isinstance(rows, int) else None
    return None


def target_shrank(context: dg.AssetExecutionContext, stream: Stream) -> str | None:
    """Why this run compares the whole table: the target lost rows since the last run (None: it did not)."""
    before = rows_left_by_last_run(context)
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
        "deleted from it outside the stream's runs (by hand, an older copy restored, or `ingest reconcile "
        "--apply-deletes`); this run compares the whole table (a time or key partition: its own) and reads the "
        "missing rows again by key"
    )
