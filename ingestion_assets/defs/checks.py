"""Asset checks every stream carries: schema and dead letters; reconciliation where the stream can compare
its source's keys with the target (database streams, API streams with a key listing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg

from ingestion_assets.catalog import Freshness
from ingestion_assets.defs.freshness import DESCRIPTION as FRESHNESS_DESCRIPTION
from ingestion_assets.defs.freshness import FRESHNESS, run_result
from ingestion_assets.defs.metadata import run_histogram
from ingestion_assets.observe.freshness import percentiles

if TYPE_CHECKING:
    from ingestion_assets.streams.reconcile.figures import Reconciliation
    from ingestion_assets.streams.runner import PartitionOutcome

SCHEMA = "schema"
DEAD_LETTERS = "dead_letters"
RECONCILIATION = "reconciliation"
WHAT_TO_DO = "what to do"  # metadata of a failed check: the command that resolves it (`ingest status` shows it)
DESCRIPTIONS = {
    SCHEMA: "the source's columns match what the stream loads",
    DEAD_LETTERS: "rows that could not load are parked, not lost",
    RECONCILIATION: "every source row up to the checkpoint is in the target at its version; no row the source deleted "
    "is left unreported",
    FRESHNESS: FRESHNESS_DESCRIPTION,
}


def check_names(reconciles: bool, freshness: Freshness | None = None) -> tuple[str, ...]:
    names = (SCHEMA, DEAD_LETTERS, RECONCILIATION) if reconciles else (SCHEMA, DEAD_LETTERS)
    return (*names, FRESHNESS) if freshness is not None else names


def check_specs(key: dg.AssetKey, reconciles: bool, freshness: Freshness | None = None) -> list[dg.AssetCheckSpec]:
    return [
        dg.AssetCheckSpec(name, asset=key, description=DESCRIPTIONS[name])
        for name in check_names(reconciles, freshness)
    ]


def check_results(
    outcomes: list[PartitionOutcome], reconciles: bool, freshness: Freshness | None = None
) -> list[dg.AssetCheckResult]:
    """One result per declared check, always: Dagster expects every check a MaterializeResult can carry."""
    builders = {SCHEMA: _schema, DEAD_LETTERS: _dead_letters, RECONCILIATION: _reconciliation}
    results = [builders[name](outcomes) for name in check_names(reconciles)]
    if freshness is not None:
        p99 = percentiles(run_histogram(outcomes)).get("p99")
        results.append(run_result(freshness, p99))
    return results


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
    """Fails (error) when a row the checkpoint covers is missing or at another version in the target; fails as a
    warning when the target keeps rows the source deleted and the stream is not set to apply them."""
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
    found = [o.reconciliation for o in outcomes if o.reconciliation is not None]
    compared = [r for r in found if r.skipped is None]
    if not compared:
        reason = "; ".join(sorted({r.skipped for r in found if r.skipped})) or "not checked this run"
        return dg.AssetCheckResult(check_name=RECONCILIATION, passed=True, metadata={"scope": reason})
    newer = sorted({o.partition for o in outcomes if o.reconciliation and o.reconciliation.newer_in_target}, key=str)
    return compared_result(compared, newer)


def compared_result(compared: list[Reconciliation], newer: list[str | None]) -> dg.AssetCheckResult:
    """The reconciliation check of comparisons that ran (a run's, or `ingest reconcile`'s); `newer`: the partitions
    whose target holds rows newer than the source's."""
    passed = all(r.passed for r in compared)
    pending = sum(r.deletes_pending for r in compared)
    total = {name: sum(getattr(r, name) for r in compared) for name in _FIGURES}
    metadata: dict[str, object] = {
        "scope": ", ".join(sorted({r.scope for r in compared})),
        "deletes": ", ".join(sorted({r.deletes for r in compared})),
        **{label: total[name] for name, label in _FIGURES.items()},
    }
    for kind, label in _SAMPLES.items():
        metadata[label] = dg.MetadataValue.json([k for r in compared for k in r.samples.get(kind, [])][:10])
    because = sorted({r.whole_because for r in compared if r.whole_because})
    if because:  # a window's comparison cannot see rows moved without a cursor: why this run looked at them all
        metadata["why the whole table"] = dg.MetadataValue.text("; ".join(because))
    errors = [r.error for r in compared if r.error]
    if errors:
        metadata["error"] = dg.MetadataValue.text("; ".join(errors))
    owed = [r.owed for r in compared if r.owed]
    if owed:  # kept in the checkpoint: every run compares the whole table, and fails here, until it is closed
        metadata["owed"] = dg.MetadataValue.text("; ".join(owed))
    repaired = total["repaired"]
    if repaired and passed:
        metadata["repair"] = (
            f"{repaired} row(s) missing or older in the target were read again by key and merged; compared again, "
            "they agree with the source"
        )
    if newer:  # the version guard keeps them: only a person can say the source's older-looking version is right
        where = " ".join(f"--partition {p}" for p in newer if p is not None)
        metadata[WHAT_TO_DO] = (
            f"{total['newer_in_target']} row(s) are newer in the target than in the source (the source's cursor went "
            f"backwards): `ingest reconcile STREAM{' ' + where if where else ''} --source-wins` loads the source's "
            "version over them"
        )
    if pending:
        metadata[WHAT_TO_DO] = (
            f"{pending} row(s) are gone from the source: set `reconcile: {{full_every_seconds: N, deletes: hard}}` "
            "(or soft) to apply the deletions found, or run `ingest reconcile STREAM --apply-deletes`"
        )
    return dg.AssetCheckResult(
        check_name=RECONCILIATION,
        passed=passed and pending == 0,
        severity=dg.AssetCheckSeverity.ERROR if not passed else dg.AssetCheckSeverity.WARN,
        metadata=metadata,  # type: ignore[arg-type]
    )


_FIGURES = {
    "source_rows": "source rows compared",
    "target_rows": "target rows compared",
    "buckets": "buckets compared",
    "buckets_differing": "buckets differing",
    "keys_diffed": "rows diffed key by key",
    "missing": "missing in target",
    "stale": "older in target than in source",
    "newer_in_target": "newer in target than in source",
    "deleted_at_source": "in target only (deleted at the source)",
    "deletions_applied": "deletions applied",
    "not_yet_synced": "not yet synced (past the checkpoint)",
    "parked": "parked as dead letters",
    "null_keys": "source rows with a NULL key (not compared; parked as dead letters)",
    "null_keys_in_target": "target rows with a NULL key (not compared)",
    "repeated_at_source": "older rows of keys repeated at the source (the target keeps the newest)",
    "repaired": "read again by key (repaired)",
    "seconds": "seconds",
}
_SAMPLES = {
    "missing": "sample of missing keys",
    "stale": "sample of older keys",
    "newer": "sample of newer keys",
    "deleted": "sample of keys deleted at the source",
    "repaired": "sample of repaired keys",
    "duplicate": "sample of keys repeated at the source",
}


def failed_check(key: dg.AssetKey, name: str, description: str, **metadata: object) -> dg.AssetCheckEvaluation:
    """Logged before a run stops on purpose (schema pause, too many dead letters), so the UI shows why."""
    return dg.AssetCheckEvaluation(
        asset_key=key,
        check_name=name,
        passed=False,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"reason": dg.MetadataValue.text(description), **metadata},  # type: ignore[dict-item]
    )
