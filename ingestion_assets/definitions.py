"""Assembles the Dagster Definitions from the catalog; no logic lives here."""

from __future__ import annotations

import dagster as dg

from ingestion_assets.catalog import load_catalog
from ingestion_assets.defs.assets import catalog_streams, is_cdc, stream_asset
from ingestion_assets.defs.cdc import build_cdc_assets
from ingestion_assets.defs.executors import build_executor
from ingestion_assets.defs.jobs import build_jobs
from ingestion_assets.defs.metadata import known_column_schemas
from ingestion_assets.defs.schedules import build_schedules
from ingestion_assets.defs.sensors import build_sensors
from ingestion_assets.defs.sources import source_specs
from ingestion_assets.settings import Settings
from ingestion_assets.state.runs import release_dead_runs_on_this_machine


@dg.definitions
def defs() -> dg.Definitions:
    settings = Settings.from_env()
    catalog = load_catalog(settings.catalog_path)
    if not catalog.execution.distributed:  # on workers a run's process ids name processes of other hosts
        release_dead_runs_on_this_machine(settings)  # a killed run's pool slots would block its source for good
    streams = [s for s in catalog_streams(settings, catalog) if not is_cdc(s)]
    columns = known_column_schemas(settings, [dg.AssetKey([s.source_name, s.name]) for s in streams])
    assets = [stream_asset(s, columns.get(dg.AssetKey([s.source_name, s.name]))) for s in streams]
    cdc_assets, cdc_sensors = build_cdc_assets(settings, catalog)
    jobs = build_jobs(streams)
    return dg.Definitions(
        assets=[*source_specs(catalog), *assets, *cdc_assets],
        jobs=list(jobs.values()),
        schedules=build_schedules(streams, jobs),
        sensors=[*build_sensors(streams), *cdc_sensors],
        executor=build_executor(settings, catalog),
    )
