"""How a failed attempt ends in Dagster: a permanent error fails the step at once, a transient one is retried."""

from __future__ import annotations

import dagster as dg

from ingestion_assets.errors import classify, describe_permanent


def permanent_failure(where: str, exc: Exception) -> dg.Failure | None:
    """A Failure that forbids retries, with the server's words and what to do; None when a retry may help
    (the caller re-raises the error and Dagster's retry policy takes it)."""
    verdict = classify(exc)
    if verdict.transient:
        return None
    return dg.Failure(description=describe_permanent(where, exc, verdict), allow_retries=False)
