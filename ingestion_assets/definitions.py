"""Assembles the Dagster Definitions from the catalog; no logic lives here."""

from __future__ import annotations

import dagster as dg

from ingestion_assets.catalog import load_catalog
from ingestion_assets.defs.assets import catalog_streams, is_cdc, stream_asset
from ingestion_assets.defs.cdc import build_cdc_assets
from ingestion_assets.defs.schedules import build_schedules
from ingestion_assets.defs.sensors import build_sensors
from ingestion_assets.settings import Settings
from ingestion_assets.state.runs import release_dead_runs_on_this_machine


@dg.definitions
def defs() -> dg.Definitions:
    settings = Settings.from_env()
    catalog = load_catalog(settings.catalog_path)
    release_dead_runs_on_this_machine(settings)  # a killed run's pool slots would block its source for good
    streams = [s for s in catalog_streams(settings, catalog) if not is_cdc(s)]
    assets = {dg.AssetKey([s.source_name, s.name]): stream_asset(s) for s in streams}
    cdc_assets, cdc_sensors = build_cdc_assets(settings, catalog)
    return dg.Definitions(
        assets=[*assets.values(), *cdc_assets],
        schedules=build_schedules(streams, assets),
        sensors=[*build_sensors(streams), *cdc_sensors],
    )
