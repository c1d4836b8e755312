"""The SQL client of a DuckDB or PostgreSQL target, made without dlt (see loading/target_sql.py).

A run's statements on its target (the binding marker, existence and column checks, the reconciliation's window,
the PostgreSQL COPY path's merge) need a client with dlt's errors, transactions and quoting, not dlt's pipeline
nor dlt itself: making the pipeline and resolving dlt's configuration for each client cost ~0.5 s of a run that
loads nothing, importing dlt ~0.7 s more. The dataset names follow dlt's defaults (`<dataset>` and
`<dataset>_staging`, normalized by the destination's naming convention), as the pipeline's clients name them.
"""

from __future__ import annotations

from typing import Any

from ingestion_assets.catalog import Destination
from ingestion_assets.loading.destinations import destination_url, duckdb_path
from ingestion_assets.loading.naming import TargetNames
from ingestion_assets.loading.target_sql import DuckDbClient, DuckDbConnections, PostgresClient
from ingestion_assets.settings import Settings

_DUCKDB: dict[tuple[Settings, str], DuckDbConnections] = {}  # one shared connection per DuckDB target and process


def has_direct_client(destination: Destination) -> bool:
    return destination.type in ("duckdb", "postgres")


def direct_sql_client(settings: Settings, destination: Destination, names: TargetNames, dataset: str) -> Any:
    """A new SQL client on `dataset` of a DuckDB or PostgreSQL target (its own connection once entered)."""
    normalized, staging = names.table(dataset), names.table(f"{dataset}_staging")
    if destination.type == "duckdb":
        return DuckDbClient(normalized, staging, _duckdb_connections(settings, destination))
    # dlt folds PostgreSQL names to lower case unless the naming convention is case sensitive (`direct`)
    return PostgresClient(normalized, staging, destination_url(settings, destination), names.convention != "direct")


def _duckdb_connections(settings: Settings, destination: Destination) -> DuckDbConnections:
    key = (settings, destination.model_dump_json())
    if key not in _DUCKDB:
        path = duckdb_path(settings, destination)
        path.parent.mkdir(parents=True, exist_ok=True)
        # DuckDB caches up to 80% of RAM by default: a loader's memory would then grow with the table.
        _DUCKDB[key] = DuckDbConnections(str(path), {"memory_limit": destination.memory_limit})
    return _DUCKDB[key]
