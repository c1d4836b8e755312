"""Assembles the Dagster Definitions from the catalog; no logic lives here."""

from __future__ import annotations

import hashlib
import os

import dagster as dg

from ingestion_assets.catalog import Catalog, load_catalog
from ingestion_assets.defs.assets import stream_asset
from ingestion_assets.defs.cdc import build_cdc_assets
from ingestion_assets.defs.executors import build_executor
from ingestion_assets.defs.freshness import cdc_freshness_checks, freshness_sensor, with_cdc_policies
from ingestion_assets.defs.identity import catalog_identity
from ingestion_assets.defs.jobs import build_jobs
from ingestion_assets.defs.metadata import known_column_schemas
from ingestion_assets.defs.schedules import build_schedules
from ingestion_assets.defs.sensors import build_sensors
from ingestion_assets.defs.sources import source_specs
from ingestion_assets.defs.streams import catalog_refs, is_cdc
from ingestion_assets.settings import Settings

_built: dict[tuple[Settings, str, str], tuple[dg.Definitions, dict[str, str]]] = {}


@dg.definitions
def defs() -> dg.Definitions:
    """Dagster loads the definitions several times in one process (six in a `dagster asset materialize`,
    more in its step process): they are built once per process for one catalog text and instance."""
    settings = Settings.from_env()
    text = settings.catalog_path.read_bytes() if settings.catalog_path.is_file() else b""
    key = (settings, os.environ.get("DAGSTER_HOME", ""), hashlib.sha256(text).hexdigest())
    if key not in _built:
        _built.clear()
        catalog = load_catalog(settings.catalog_path)
        _built[key] = (_build(settings, catalog), catalog_identity(settings, catalog))
    return _built[key][0]


def built_identity() -> dict[str, str] | None:
    """The catalog identity (defs/worker_checks.py) of the definitions this process built last, taken from the
    catalog they were built from: what a Celery worker's next step executes, whatever the file says by then."""
    return next(iter(_built.values()))[1] if _built else None


def _build(settings: Settings, catalog: Catalog) -> dg.Definitions:
    streams = [s for s in catalog_refs(settings, catalog) if not is_cdc(s)]
    keys = [dg.AssetKey([s.source_name, s.name]) for s in streams]
    # on workers a run's process ids name processes of other hosts: no dead runs are released there
    columns = known_column_schemas(settings, keys, release_dead_runs=not catalog.execution.distributed, pools=catalog)
    assets = [stream_asset(s, columns.get(dg.AssetKey([s.source_name, s.name]))) for s in streams]
    cdc_assets, cdc_sensors = build_cdc_assets(settings, catalog)
    freshness = freshness_sensor(catalog)
    jobs = build_jobs(streams)
    return dg.Definitions(
        assets=[*source_specs(catalog), *assets, *with_cdc_policies(cdc_assets, catalog)],
        asset_checks=cdc_freshness_checks(catalog),
        jobs=list(jobs.values()),
        schedules=build_schedules(streams, jobs),
        sensors=[*build_sensors(streams), *cdc_sensors, *([freshness] if freshness else [])],
        executor=build_executor(settings, catalog),
    )
