"""Why a run's step failed, in one line: what `ingest status` shows beside a failed stream."""

from __future__ import annotations

import dagster as dg

from ingestion_assets.sources.redact import redact


def step_error(instance: dg.DagsterInstance, run_id: str, key: dg.AssetKey) -> str | None:
    """The first line of the error of the step that materializes `key` in the run (a table stream's own step, a
    CDC source's one step for all its streams), redacted; None when no such step failed."""
    failures = [e for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE) if e.dagster_event]
    own = "__".join(key.path)
    chosen = [e for e in failures if e.step_key == own] or [
        e for e in failures if (e.step_key or "").startswith(f"{key.path[0]}__")
    ]
    if not chosen:
        return None
    event = chosen[-1].dagster_event
    data = event.step_failure_data if event is not None else None
    if data is None:
        return None
    if data.user_failure_data is not None and data.user_failure_data.description:
        return _first_line(data.user_failure_data.description)
    error = data.error
    while error is not None and error.cause is not None and (error.cls_name or "").startswith("Dagster"):
        error = error.cause  # Dagster's wrapper ("Error occurred while executing op ..."): the user code's error
    if error is None:
        return None
    head, said, words = error.message.partition(f"{error.cls_name}: ")  # `module.Class: words`, as printed
    return _first_line(words if said and "\n" not in head else error.message)


def _first_line(text: str) -> str | None:
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return redact(first) or None
