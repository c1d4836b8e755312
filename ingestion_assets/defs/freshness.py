"""A stream's `freshness: {max_lag, warn_lag}` in Dagster: the asset's native freshness policy (the UI's
freshness status, evaluated by the daemon) and the `freshness` check that enforces it: at the end of each run,
from a sensor between runs (a stream nobody syncs goes stale without a run), and for CDC streams as a check of
their own (their multi-asset is defs/cdc.py's)."""

# No `from __future__ import annotations` here: Dagster inspects the check's `context` annotation at runtime.

import datetime as dt
from collections.abc import Iterable, Iterator
from typing import Any

import dagster as dg
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from ingestion_assets.catalog import Catalog, Freshness, PostgresSource

FRESHNESS = "freshness"
DESCRIPTION = "the stream's last sync and its rows' commit-to-target latency (p99) are within `max_lag`"
P99 = "freshness p99 ms"


POLICY_FLOOR = dt.timedelta(minutes=1)  # Dagster's freshness policies refuse shorter windows


def freshness_policy(freshness: Freshness | None) -> dg.FreshnessPolicy | None:
    """Dagster's policy takes windows of a minute or more: a shorter `max_lag` shows there as one minute (and
    a `warn_lag` under a minute is left out), while the `freshness` check still enforces the catalog's value."""
    if freshness is None:
        return None
    fail = max(freshness.max_lag, POLICY_FLOOR)
    warn = freshness.warn_lag if freshness.warn_lag is not None and freshness.warn_lag >= POLICY_FLOOR else None
    warn = warn if warn is not None and warn < fail else None
    return dg.FreshnessPolicy.time_window(fail_window=fail, warn_window=warn)


def verdict(
    freshness: Freshness, sync_age_seconds: float | None, p99_ms: float | None
) -> tuple[bool, dg.AssetCheckSeverity, dict[str, Any]]:
    """Passed, severity and the figures: stale (error) beyond max_lag, a warning beyond warn_lag. A stream never
    synced is stale; a sync whose rows carried no commit time is judged by its age alone."""
    metadata: dict[str, Any] = {"max lag seconds": freshness.max_lag.total_seconds()}
    if freshness.warn_lag is not None:
        metadata["warn lag seconds"] = freshness.warn_lag.total_seconds()
    if sync_age_seconds is None:
        return False, dg.AssetCheckSeverity.ERROR, {**metadata, "reason": "never synced"}
    metadata["seconds since the last sync"] = round(sync_age_seconds, 1)
    lag = sync_age_seconds
    if p99_ms is not None:
        metadata["commit-to-target p99 seconds"] = round(p99_ms / 1000, 3)
        lag = max(lag, p99_ms / 1000)
    metadata["lag seconds"] = round(lag, 3)
    if lag > freshness.max_lag.total_seconds():
        return False, dg.AssetCheckSeverity.ERROR, {**metadata, "reason": f"stale: {lag:,.0f} s behind"}
    if freshness.warn_lag is not None and lag > freshness.warn_lag.total_seconds():
        return False, dg.AssetCheckSeverity.WARN, {**metadata, "reason": f"falling behind: {lag:,.0f} s"}
    return True, dg.AssetCheckSeverity.WARN, metadata


def run_result(freshness: Freshness, p99_ms: float | None) -> dg.AssetCheckResult:
    """The check at the end of a run: the stream was just synced; its rows' latency decides."""
    passed, severity, metadata = verdict(freshness, 0.0, p99_ms)
    return dg.AssetCheckResult(check_name=FRESHNESS, passed=passed, severity=severity, metadata=metadata)


def stored_evaluation(instance: dg.DagsterInstance, key: dg.AssetKey, freshness: Freshness) -> dg.AssetCheckEvaluation:
    """The check from what the instance holds: the last materialization's age and its p99 latency."""
    record = next(iter(instance.get_asset_records([key])), None)
    event = record.asset_entry.last_materialization if record is not None else None
    age, p99 = None, None
    if event is not None:
        age = dt.datetime.now(dt.UTC).timestamp() - event.timestamp
        found = event.asset_materialization.metadata.get(P99) if event.asset_materialization else None
        p99 = float(found.value) if found is not None and isinstance(found.value, int | float) else None
    passed, severity, metadata = verdict(freshness, age, p99)
    return dg.AssetCheckEvaluation(
        asset_key=key, check_name=FRESHNESS, passed=passed, severity=severity, metadata=metadata
    )


def stream_policies(catalog: Catalog) -> dict[dg.AssetKey, Freshness]:
    return {
        dg.AssetKey([source_name, stream_name]): spec.freshness
        for source_name, _, stream_name, spec in catalog.streams()
        if spec.freshness is not None
    }


def with_cdc_policies(assets: Iterable[dg.AssetsDefinition], catalog: Catalog) -> list[dg.AssetsDefinition]:
    """The CDC multi-assets with each stream's freshness policy (defs/cdc.py builds them without)."""
    policies = stream_policies(catalog)

    def apply(spec: dg.AssetSpec) -> dg.AssetSpec:
        policy = freshness_policy(policies.get(spec.key))
        return spec if policy is None else dg.apply_freshness_policy(spec, policy)

    return [asset.map_asset_specs(apply) for asset in assets]


def cdc_freshness_checks(catalog: Catalog) -> list[dg.AssetChecksDefinition]:
    """One check definition per CDC source with freshness policies; it runs after the source's job and on demand."""
    policies = stream_policies(catalog)
    checks = []
    for source_name, source in catalog.sources.items():
        if not isinstance(source, PostgresSource) or source.mode != "cdc":
            continue
        keys = [k for k in policies if k.path[0] == source_name]
        if keys:
            checks.append(_stored_checks(source_name, {k: policies[k] for k in keys}))
    return checks


def _stored_checks(source_name: str, policies: dict[dg.AssetKey, Freshness]) -> dg.AssetChecksDefinition:
    @dg.multi_asset_check(
        name=f"{source_name}__freshness",
        specs=[dg.AssetCheckSpec(FRESHNESS, asset=key, description=DESCRIPTION) for key in policies],
        can_subset=True,
    )
    def _checks(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        for check_key in context.selected_asset_check_keys:
            found = stored_evaluation(context.instance, check_key.asset_key, policies[check_key.asset_key])
            yield dg.AssetCheckResult(
                asset_key=check_key.asset_key,
                check_name=FRESHNESS,
                passed=found.passed,
                severity=found.severity,
                metadata=found.metadata,
            )

    return _checks


def freshness_sensor(catalog: Catalog) -> dg.SensorDefinition | None:
    """Between runs: records the check whenever a stream's verdict changes (it goes stale without any run)."""
    policies = stream_policies(catalog)
    if not policies:
        return None

    @dg.sensor(
        name="ingest_freshness",
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="evaluates each stream's freshness check between runs; records it when the verdict changes",
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        changed = evaluate_all(context.instance, policies)
        return dg.SkipReason(f"freshness evaluated; changed: {', '.join(changed) or 'none'}")

    return _sensor


def evaluate_all(instance: dg.DagsterInstance, policies: dict[dg.AssetKey, Freshness]) -> list[str]:
    """Records the evaluations whose verdict differs from the latest one stored; returns those streams' names."""
    check_keys = [dg.AssetCheckKey(key, FRESHNESS) for key in policies]
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(check_keys)
    changed = []
    for check_key in check_keys:
        evaluation = stored_evaluation(instance, check_key.asset_key, policies[check_key.asset_key])
        record = latest.get(check_key)
        before = None if record is None else record.status == AssetCheckExecutionRecordStatus.SUCCEEDED
        if before != evaluation.passed:
            instance.report_runless_asset_event(evaluation)
            changed.append(".".join(check_key.asset_key.path))
    return changed
