"""Asset checks every stream carries: schema and dead letters; reconciliation where the stream can compare
its source's keys with the target (database streams, API streams with a key listing)."""

from __future__ import annotations

import dagster as dg

from ingestion_assets.streams.runner import PartitionOutcome

SCHEMA = "schema"
DEAD_LETTERS = "dead_letters"
RECONCILIATION = "reconciliation"
DESCRIPTIONS = {
    SCHEMA: "the source's columns match what the stream loads",
    DEAD_LETTERS: "rows that could not load are parked, not lost",
    RECONCILIATION: "every source row up to the checkpoint is in the target",
}


def check_names(reconciles: bool) -> tuple[str, ...]:
    return (SCHEMA, DEAD_LETTERS, RECONCILIATION) if reconciles else (SCHEMA, DEAD_LETTERS)


def check_specs(key: dg.AssetKey, reconciles: bool) -> list[dg.AssetCheckSpec]:
    return [dg.AssetCheckSpec(name, asset=key, description=DESCRIPTIONS[name]) for name in check_names(reconciles)]


def check_results(outcomes: list[PartitionOutcome], reconciles: bool) -> list[dg.AssetCheckResult]:
    """One result per declared check, always: Dagster expects every check a MaterializeResult can carry."""
    builders = {SCHEMA: _schema, DEAD_LETTERS: _dead_letters, RECONCILIATION: _reconciliation}
    return [builders[name](outcomes) for name in check_names(reconciles)]


def _schema(outcomes: list[PartitionOutcome]) -> dg.AssetCheckResult:
    changes = [change for o in outcomes for change in o.schema_changes]
    return dg.AssetCheckResult(
        check_name=SCHEMA, passed=True, metadata={"changes applied": dg.MetadataValue.json(changes)}
    )


def _dead_letters(outcomes: list[PartitionOutcome]) -> dg.AssetCheckResult:
    dead = sum(o.result.dead_letters for o in outcomes)
    return dg.AssetCheckResult(
        check_name=DEAD_LETTERS,
        passed=dead == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"dead letters this run": dead, "values nulled this run": sum(o.result.nulled for o in outcomes)},
    )


def _reconciliation(outcomes: list[PartitionOutcome]) -> dg.AssetCheckResult:
    listings = [o.key_listing for o in outcomes if o.key_listing is not None]
    if listings:  # an API stream's key listing: the same figures, no versions to compare
        return dg.AssetCheckResult(
            check_name=RECONCILIATION,
            passed=all(listing.passed for listing in listings),
            metadata={
                "scope": "key listing",
                "keys checked": sum(listing.compared for listing in listings),
                "missing in target": sum(listing.missing for listing in listings),
                "older in target than in source": sum(listing.stale for listing in listings),
                "deleted at the source (target only)": sum(listing.target_only for listing in listings),
                "deletions applied": sum(listing.deletions_applied for listing in listings),
                "refused": dg.MetadataValue.text("; ".join(str(x.refused) for x in listings if x.refused) or "-"),
                "sample of deleted keys": dg.MetadataValue.json([k for x in listings for k in x.sample][:10]),
            },
        )
    reconciled = [o.reconciliation for o in outcomes if o.reconciliation is not None]
    if not reconciled:
        return dg.AssetCheckResult(check_name=RECONCILIATION, passed=True, metadata={"scope": "not checked this run"})
    return dg.AssetCheckResult(
        check_name=RECONCILIATION,
        passed=all(r.passed for r in reconciled),
        metadata={
            "scope": reconciled[0].scope,
            "keys checked": sum(r.checked for r in reconciled),
            "missing in target": sum(r.missing for r in reconciled),
            "older in target than in source": sum(r.stale for r in reconciled),
            "parked as dead letters": sum(r.parked for r in reconciled),
            "sample of missing keys": dg.MetadataValue.json([k for r in reconciled for k in r.sample][:10]),
        },
    )


def failed_check(key: dg.AssetKey, name: str, description: str, **metadata: object) -> dg.AssetCheckEvaluation:
    """Logged before a run stops on purpose (schema pause, too many dead letters), so the UI shows why."""
    return dg.AssetCheckEvaluation(
        asset_key=key,
        check_name=name,
        passed=False,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"reason": dg.MetadataValue.text(description), **metadata},  # type: ignore[dict-item]
    )
