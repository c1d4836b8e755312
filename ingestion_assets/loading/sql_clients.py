"""dlt's own SQL client of a DuckDB or PostgreSQL target, made without a dlt pipeline.

A run's statements on its target (the binding marker, existence and column checks, the reconciliation's window,
the PostgreSQL COPY path's merge) need dlt's SQL client (its errors, transactions and quoting), not its pipeline:
making the pipeline and resolving dlt's configuration for each client cost ~0.5 s of a run that loads nothing.
The client classes are dlt's; the dataset names follow dlt's defaults (`<dataset>` and `<dataset>_staging`,
normalized by the destination's naming convention), as the pipeline's clients name them.
"""

from __future__ import annotations

from typing import Any

from ingestion_assets.catalog import Destination
from ingestion_assets.loading.destinations import make_destination
from ingestion_assets.loading.naming import TargetNames
from ingestion_assets.settings import Settings

_FACTORIES: dict[tuple[Settings, str], tuple[Any, Any]] = {}  # (credentials, capabilities) per destination


def has_direct_client(destination: Destination) -> bool:
    return destination.type in ("duckdb", "postgres")


def direct_sql_client(settings: Settings, destination: Destination, names: TargetNames, dataset: str) -> Any:
    """A new SQL client on `dataset` of a DuckDB or PostgreSQL target (its own connection once entered)."""
    credentials, capabilities = _resolved(settings, destination, names)
    client_class: Any
    if destination.type == "duckdb":
        from dlt.destinations.impl.duckdb.sql_client import DuckDbSqlClient as client_class
    else:
        from dlt.destinations.impl.postgres.sql_client import Psycopg2SqlClient as client_class
    normalized = names.table(dataset)
    return client_class(normalized, names.table(f"{dataset}_staging"), credentials, capabilities)


def _resolved(settings: Settings, destination: Destination, names: TargetNames) -> tuple[Any, Any]:
    """The destination's credentials (resolved: DuckDB's hold the connection pool of the file) and capabilities
    (case folding as the naming convention wants it), made once per process."""
    key = (settings, destination.model_dump_json())
    if key not in _FACTORIES:
        factory = make_destination(settings, destination)
        credentials = factory.config_params["credentials"]
        if not credentials.is_resolved():
            credentials.resolve()
        _FACTORIES[key] = (credentials, factory.capabilities(naming=names.naming_convention()))
    return _FACTORIES[key]
