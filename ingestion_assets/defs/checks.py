"""Asset checks every stream carries: schema, dead letters and reconciliation, from what a run saw."""

from __future__ import annotations

import dagster as dg

from ingestion_assets.streams.runner import PartitionOutcome

SCHEMA = "schema"
DEAD_LETTERS = "dead_letters"
RECONCILIATION = "reconciliation"


def check_specs(key: dg.AssetKey) -> list[dg.AssetCheckSpec]:
    return [
        dg.AssetCheckSpec(SCHEMA, asset=key, description="the source's columns match what the stream loads"),
        dg.AssetCheckSpec(DEAD_LETTERS, asset=key, description="rows that could not load are parked, not lost"),
        dg.AssetCheckSpec(
            RECONCILIATION, asset=key, description="every source row up to the checkpoint is in the target"
        ),
    ]


def check_results(outcomes: list[PartitionOutcome]) -> list[dg.AssetCheckResult]:
    changes = [change for o in outcomes for change in o.schema_changes]
    dead = sum(o.result.dead_letters for o in outcomes)
    nulled = sum(o.result.nulled for o in outcomes)
    results = [
        dg.AssetCheckResult(
            check_name=SCHEMA, passed=True, metadata={"changes applied": dg.MetadataValue.json(changes)}
        ),
        dg.AssetCheckResult(
            check_name=DEAD_LETTERS,
            passed=dead == 0,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"dead letters this run": dead, "values nulled this run": nulled},
        ),
    ]
    reconciled = [o.reconciliation for o in outcomes if o.reconciliation is not None]
    if reconciled:
        results.append(
            dg.AssetCheckResult(
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
        )
    return results


def failed_check(key: dg.AssetKey, name: str, description: str, **metadata: object) -> dg.AssetCheckEvaluation:
    """Logged before a run stops on purpose (schema pause, too many dead letters), so the UI shows why."""
    return dg.AssetCheckEvaluation(
        asset_key=key,
        check_name=name,
        passed=False,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"reason": dg.MetadataValue.text(description), **metadata},  # type: ignore[dict-item]
    )
