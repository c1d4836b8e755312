"""Assembles the Dagster Definitions from the catalog; no logic lives here."""

from __future__ import annotations

import dagster as dg

from ingestion_assets.catalog import load_catalog
from ingestion_assets.defs.assets import catalog_streams, stream_asset
from ingestion_assets.defs.schedules import build_schedules
from ingestion_assets.defs.sensors import build_sensors
from ingestion_assets.settings import Settings


@dg.definitions
def defs() -> dg.Definitions:
    settings = Settings.from_env()
    streams = catalog_streams(settings, load_catalog(settings.catalog_path))
    assets = {dg.AssetKey([s.source_name, s.name]): stream_asset(s) for s in streams}
    return dg.Definitions(
        assets=list(assets.values()),
        schedules=build_schedules(streams, assets),
        sensors=build_sensors(streams),
    )
