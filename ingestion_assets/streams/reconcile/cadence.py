"""After a run: which comparison it owes (its window, or the whole table when one is due) and what the
checkpoint remembers of it, so most runs only do the cheap window check."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import psycopg2

from ingestion_assets.catalog import Reconcile
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.loading.target_sql import database_exception
from ingestion_assets.partitions import window_for
from ingestion_assets.sources.postgres.query import ReadPlan
from ingestion_assets.streams.postgres_table import PostgresTableStream
from ingestion_assets.streams.reconcile.canonical import NotComparable
from ingestion_assets.streams.reconcile.compare import Request, reconcile
from ingestion_assets.streams.reconcile.figures import Reconciliation
from ingestion_assets.streams.reconcile.relation import Scope
from ingestion_assets.streams.reconcile.repair import OWED, Repair, owed_reason, repair
from ingestion_assets.sync import SyncResult

RECONCILED_AT = "reconciled_full_at"  # checkpoint detail: when the last full comparison completed (UTC)
# checkpoint detail: {"from": position} where the rows loaded since the last finished check begin (None: the start).
# Written with a run's first slice, cleared once its check has run: a run killed before its check (or during it)
# leaves its window to the next run's check, which would otherwise compare only its own.
UNCHECKED = "unchecked_from"
ERROR_CHARS = 400


@dataclass(frozen=True)
class RunCheck:
    figures: Reconciliation | None
    carried: dict[str, Any] = field(default_factory=dict)  # checkpoint details to store after it (None: remove)


def carried_details(details: Mapping[str, Any]) -> dict[str, Any]:
    """What a run keeps from the checkpoint it started from."""
    return {name: details[name] for name in (RECONCILED_AT, OWED, UNCHECKED) if name in details}


def reconcile_run(
    stream: PostgresTableStream,
    plan: ReadPlan,
    loader: Loader,
    partition: str | None,
    result: SyncResult,
    carried: Mapping[str, Any],
    whole_because: Sequence[str] = (),
    generation: int = 1,
    run_id: str = "",
) -> RunCheck:
    """Compare the run's window, or its whole table or partition (`whole_because`: the run's reasons, such as a
    refresh; a gap owed; `scope: full`; a full comparison due); repair what it finds missing or older; remember
    what it could not repair."""
    settings = stream.spec.reconcile
    if stream.spec.write_disposition == "append":
        return RunCheck(Reconciliation(settings.scope, skipped="append keeps every version of a row: not compared"))
    now = dt.datetime.now(dt.UTC)
    owed = carried.get(OWED)
    because = [*whole_because]
    if owed is not None:
        because.append("a gap an earlier comparison found is owed")
    if full_due(settings, carried.get(RECONCILED_AT), now):
        because.append(f"a full comparison is due (full_every_seconds: {settings.full_every_seconds})")
    full = bool(because) or settings.scope == "full"
    if not full and settings.scope == "off":
        return RunCheck(None)
    unchecked = carried.get(UNCHECKED)
    scope = Scope(
        "full" if full else "window",
        window=window_for(stream.spec, partition),
        cursor=tuple(plan.cursor),
        # from where an earlier run's loads went unchecked (killed before its check), else where this run began
        lowest=unchecked.get("from") if isinstance(unchecked, Mapping) else result.started_from,
        highest=result.position,
    )
    request = Request(stream.source_url(), plan, loader, scope, result.position, settings.deletes)
    how = Repair(stream, plan, generation, partition, run_id) if repairs(stream) else None
    try:
        figures = dataclasses.replace(compared(request, how), whole_because="; ".join(because) or None)
    except NotComparable as exc:
        return RunCheck(Reconciliation(scope.name, skipped=str(exc)))
    kept: dict[str, Any] = {}
    # Remembered only where a cadence asks (a checkpoint more per run otherwise, for nothing); a full comparison
    # that did not finish is not recorded, so the next run owes it again.
    if full and bool(settings.full_every_seconds) and figures.error is None:
        kept[RECONCILED_AT] = now.isoformat()
    why = owed_reason(figures, stream.qualified_name)
    if why is not None:  # every later run compares the whole table, and fails its check, until the gap is closed
        since = owed.get("since") if isinstance(owed, Mapping) else None
        kept[OWED] = {"since": since or now.isoformat(), "why": why}
        figures = dataclasses.replace(figures, owed=why)
    elif owed is not None:  # a full comparison found nothing left unrepaired: the gap is closed
        kept[OWED] = None
    return RunCheck(dataclasses.replace(figures, found_keys=None, newer_keys=None), kept)


def compared(request: Request, how: Repair | None) -> Reconciliation:
    """The comparison, then the repair of what it found. A failure of either fails the check, not the run: the
    slices are loaded and checkpointed (a retry would read nothing new); what was found stays owed."""
    try:
        figures = reconcile(request)
    except failures() as exc:
        return Reconciliation(request.scope.name, error=f"{type(exc).__name__}: {exc}"[:ERROR_CHARS])
    if how is None:
        return figures
    try:
        return repair(request, figures, how)
    except failures() as exc:
        return dataclasses.replace(figures, error=f"the repair failed: {type(exc).__name__}: {exc}"[:ERROR_CHARS])


def repairs(stream: PostgresTableStream) -> bool:
    """Merge streams with a key repair by key; a `replace` stream reads its whole table every run anyway."""
    return stream.spec.write_disposition == "merge" and bool(stream.spec.primary_key)


def failures() -> tuple[type[Exception], ...]:
    """What a comparison or a repair meets on either side (the source, the target, dlt's load)."""
    from dlt.common.exceptions import DltException

    return (psycopg2.Error, duckdb.Error, database_exception(), DltException, OSError)


def full_due(settings: Reconcile, last: str | None, now: dt.datetime) -> bool:
    if settings.full_every_seconds is None:
        return False
    if last is None:
        return True
    try:
        since = (now - dt.datetime.fromisoformat(last)).total_seconds()
    except (TypeError, ValueError):
        return True  # unreadable: compare now rather than never
    return since >= settings.full_every_seconds
