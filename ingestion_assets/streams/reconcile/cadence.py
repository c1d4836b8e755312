"""After a run: which comparison it owes (its window, or the whole table when one is due) and what the
checkpoint remembers of it, so most runs only do the cheap window check."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
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
from ingestion_assets.sync import SyncResult

RECONCILED_AT = "reconciled_full_at"  # checkpoint detail: when the last full comparison completed (UTC)
ERROR_CHARS = 400


@dataclass(frozen=True)
class RunCheck:
    figures: Reconciliation | None
    carried: dict[str, Any] = field(default_factory=dict)  # checkpoint details to store after it


def carried_details(details: Mapping[str, Any]) -> dict[str, Any]:
    """What a run keeps from the checkpoint it started from."""
    return {RECONCILED_AT: details[RECONCILED_AT]} if RECONCILED_AT in details else {}


def reconcile_run(
    stream: PostgresTableStream,
    plan: ReadPlan,
    loader: Loader,
    partition: str | None,
    result: SyncResult,
    carried: Mapping[str, Any],
    forced_full: bool = False,
) -> RunCheck:
    """Compare the run's window, or (when due, or `forced_full` after a refresh) its whole table or partition."""
    settings = stream.spec.reconcile
    if stream.spec.write_disposition == "append":
        return RunCheck(Reconciliation(settings.scope, skipped="append keeps every version of a row: not compared"))
    now = dt.datetime.now(dt.UTC)
    full = forced_full or settings.scope == "full" or full_due(settings, carried.get(RECONCILED_AT), now)
    if not full and settings.scope == "off":
        return RunCheck(None)
    scope = Scope(
        "full" if full else "window",
        window=window_for(stream.spec, partition),
        cursor=tuple(plan.cursor),
        lowest=result.started_from,
        highest=result.position,
    )
    request = Request(stream.source_url(), plan, loader, scope, result.position, settings.deletes)
    try:
        figures = reconcile(request)
    except NotComparable as exc:
        return RunCheck(Reconciliation(scope.name, skipped=str(exc)))
    except (psycopg2.Error, duckdb.Error, database_exception()) as exc:
        # The slices are loaded and checkpointed: fail the check, not the run (a retry would read nothing new);
        # a full comparison that did not finish is not recorded, so the next run owes it again.
        return RunCheck(Reconciliation(scope.name, error=f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]))
    # Remembered only where a cadence asks (a checkpoint more per run otherwise, for nothing).
    remember = full and bool(settings.full_every_seconds)
    return RunCheck(figures, {RECONCILED_AT: now.isoformat()} if remember else {})


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
