"""Assembles the Dagster Definitions from the catalog; no logic lives here."""

from __future__ import annotations

import dagster as dg

from ingestion_assets.catalog import load_catalog
from ingestion_assets.defs.assets import build_stream_assets
from ingestion_assets.settings import Settings


@dg.definitions
def defs() -> dg.Definitions:
    settings = Settings.from_env()
    catalog = load_catalog(settings.catalog_path)
    return dg.Definitions(assets=build_stream_assets(settings, catalog))
