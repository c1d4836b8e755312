"""Reconciliation of a table stream's target with its source: counts and key checksums per bucket on both
sides, the key diff only where they differ, and (when asked) the hard deletes polling cannot see, applied."""

from ingestion_assets.streams.reconcile.cadence import RECONCILED_AT, RunCheck, carried_details, reconcile_run
from ingestion_assets.streams.reconcile.canonical import NotComparable
from ingestion_assets.streams.reconcile.compare import Request, reconcile
from ingestion_assets.streams.reconcile.figures import Reconciliation
from ingestion_assets.streams.reconcile.relation import Scope

__all__ = [
    "RECONCILED_AT",
    "NotComparable",
    "Reconciliation",
    "Request",
    "RunCheck",
    "Scope",
    "carried_details",
    "reconcile",
    "reconcile_run",
]
