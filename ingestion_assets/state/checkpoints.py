"""Checkpoints in the Dagster instance: one position per stream and partition, as asset event metadata.

A checkpoint is an AssetObservation logged during the run right after a slice's load committed, and
the final one rides on the materialization. The newest event carrying CHECKPOINT_KEY wins; a reset is
such an event whose position is null.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import dagster as dg

from ingestion_assets.state.model import Checkpoint

CHECKPOINT_KEY = "ingest/checkpoint"
_PAGE = 50


def checkpoint_metadata(position: dict[str, Any] | None, **details: Any) -> dict[str, Any]:
    """The metadata entry an operator sees in the UI and `latest_checkpoint` reads back."""
    return {CHECKPOINT_KEY: dg.MetadataValue.json({"position": position, **details})}


def latest_checkpoint(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, partition: str | None = None
) -> Checkpoint | None:
    """The newest checkpoint of a stream (partition), whether it came from an observation or a materialization."""
    records_filter = dg.AssetRecordsFilter(
        asset_key=asset_key, asset_partitions=[partition] if partition is not None else None
    )
    found = [
        _newest_with_checkpoint(instance.fetch_observations, records_filter),
        _newest_with_checkpoint(instance.fetch_materializations, records_filter),
    ]
    candidates = [c for c in found if c is not None]
    return max(candidates, key=lambda c: c.storage_id) if candidates else None


def live_checkpoint(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, partition: str | None = None
) -> Checkpoint | None:
    """The newest checkpoint of the table readers query: those of a refresh under way or stopped (details
    `refresh`: its shadow table's, or a retained re-read's) are passed over, to the one before it began."""
    records_filter = dg.AssetRecordsFilter(
        asset_key=asset_key, asset_partitions=[partition] if partition is not None else None
    )
    found = [
        _newest_with_checkpoint(fetch, records_filter, keep=lambda details: "refresh" not in details)
        for fetch in (instance.fetch_observations, instance.fetch_materializations)
    ]
    candidates = [c for c in found if c is not None]
    return max(candidates, key=lambda c: c.storage_id) if candidates else None


def reset_checkpoint(instance: dg.DagsterInstance, asset_key: dg.AssetKey, partition: str | None, reason: str) -> None:
    """Record that the stream starts over; the history of positions stays in the event log. The
    generation stays: a reset re-reads, it does not start a new generation."""
    previous = latest_checkpoint(instance, asset_key, partition)
    generation = previous.details.get("generation", 1) if previous is not None else 1
    InstanceStateStore(instance, asset_key).commit(partition, None, reset=True, reason=reason, generation=generation)


def _newest_with_checkpoint(
    fetch: Callable[..., Any],
    records_filter: dg.AssetRecordsFilter,
    keep: Callable[[dict[str, Any]], bool] = lambda details: True,
) -> Checkpoint | None:
    cursor = None
    while True:
        result = fetch(records_filter, limit=_PAGE, cursor=cursor, ascending=False)
        for record in result.records:
            event = record.asset_observation or record.asset_materialization
            entry = (event.metadata or {}).get(CHECKPOINT_KEY) if event is not None else None
            if entry is not None and keep(entry.value):
                stored = dict(entry.value)
                return Checkpoint(
                    position=stored.pop("position", None),
                    run_id=record.run_id,
                    committed_at=dt.datetime.fromtimestamp(record.timestamp, tz=dt.UTC),
                    storage_id=record.storage_id,
                    details=stored,
                )
        if not result.has_more:
            return None
        cursor = result.cursor


class InstanceStateStore:
    """The runner's state store on a Dagster instance: inside a run checkpoints are logged as the run's
    events (stored at once); outside one (CLI, sensors) as runless events."""

    def __init__(
        self,
        instance: dg.DagsterInstance,
        asset_key: dg.AssetKey,
        log_event: Callable[[dg.AssetObservation], None] | None = None,
    ) -> None:
        self._instance = instance
        self._asset_key = asset_key
        self._log_event = log_event or instance.report_runless_asset_event

    def latest(self, partition: str | None) -> Checkpoint | None:
        return latest_checkpoint(self._instance, self._asset_key, partition)

    def report_check(
        self, name: str | None, passed: bool, severity: dg.AssetCheckSeverity, metadata: dict[str, Any]
    ) -> None:
        """A check's evaluation outside a run (`ingest reconcile`): the stream's latest for the status and the UI."""
        assert name is not None
        evaluation = dg.AssetCheckEvaluation(
            asset_key=self._asset_key, check_name=name, passed=passed, severity=severity, metadata=metadata
        )
        self._instance.report_runless_asset_event(evaluation)

    def observe(self, metadata: dict[str, Any]) -> None:
        """An event of the stream's asset that is no checkpoint (an operator's act: dead letters discarded)."""
        self._log_event(dg.AssetObservation(asset_key=self._asset_key, metadata=metadata))

    def commit(self, partition: str | None, position: dict[str, Any] | None, **details: Any) -> None:
        self._log_event(
            dg.AssetObservation(
                asset_key=self._asset_key, partition=partition, metadata=checkpoint_metadata(position, **details)
            )
        )
