"""Reconciliation of a table stream's target with its source: counts and key checksums per bucket on both
sides, the key diff only where they differ, the rows missing or older there read again by key, and (when asked)
the hard deletes polling cannot see, applied."""

from ingestion_assets.streams.reconcile.cadence import (
    RECONCILED_AT,
    UNCHECKED,
    RunCheck,
    carried_details,
    reconcile_run,
)
from ingestion_assets.streams.reconcile.canonical import NotComparable
from ingestion_assets.streams.reconcile.compare import Request, reconcile
from ingestion_assets.streams.reconcile.figures import Reconciliation
from ingestion_assets.streams.reconcile.relation import Scope
from ingestion_assets.streams.reconcile.repair import OWED, REPAIR_CAP, Repair, owed_reason

__all__ = [
    "OWED",
    "RECONCILED_AT",
    "REPAIR_CAP",
    "UNCHECKED",
    "NotComparable",
    "Reconciliation",
    "Repair",
    "Request",
    "RunCheck",
    "Scope",
    "carried_details",
    "owed_reason",
    "reconcile",
    "reconcile_run",
]
