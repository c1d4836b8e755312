"""A polled table stream's target holding fewer rows than the last run left in it, with no deletion of ours in
between: rows were deleted from it behind the product's back (by hand, a restore of an older copy of the table).
The rows' cursors lie behind the checkpoint, so no window comparison sees them: the run says so, fails its
reconciliation check, and keeps a full comparison owed, which the next run does and repairs from."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import dagster as dg

from ingestion_assets.defs.metadata import ROW_COUNT
from ingestion_assets.state.checkpoints import InstanceStateStore
from ingestion_assets.streams.reconcile import OWED
from ingestion_assets.streams.runner import PartitionOutcome


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


def owe_if_shrank(
    store: InstanceStateStore, name: str, before: int | None, now: Any, outcomes: list[PartitionOutcome]
) -> str | None:
    """When the target lost rows no run of ours deleted: the reason, stored as owed in each compared partition's
    checkpoint (the next run compares the whole table and reads the rows again by key) and on its check."""
    if before is None or not isinstance(now, int) or now >= before:
        return None
    compared = [o for o in outcomes if o.reconciliation is not None and o.reconciliation.skipped is None]
    if not compared or any(o.mode.startswith("refresh") or o.drained or o.started_over for o in outcomes):
        return None  # a refresh or a re-read from the start (a target found not to match) starts the table over
    if any(o.reconciliation is not None and o.reconciliation.deletions_applied for o in outcomes):
        return None  # this run's own deletions (reconcile.deletes: hard)
    why = (
        f"the target holds {now:,} row(s), {before - now:,} fewer than the last run left in it, and no run of "
        f"{name} deleted any: rows were deleted from the target outside the product (or an older copy of the "
        "table was restored); the next run compares the whole table and reads the missing rows again by key"
    )
    since = dt.datetime.now(dt.UTC).isoformat()
    for outcome in compared:
        assert outcome.reconciliation is not None
        outcome.reconciliation = dataclasses.replace(outcome.reconciliation, owed=why)
        if outcome.checkpoint and OWED not in outcome.checkpoint:
            outcome.checkpoint[OWED] = {"since": since, "why": why}
            store.commit(outcome.partition, outcome.result.position, **outcome.checkpoint)
    return why
