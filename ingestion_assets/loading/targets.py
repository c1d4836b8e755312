"""The loader for a destination: lakes get theirs (loading/lake.py); MariaDB's databases are prepared first."""

from __future__ import annotations

from typing import Any

from ingestion_assets.catalog import Destination
from ingestion_assets.loading.destinations import destination_url
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.settings import Settings


def make_loader(settings: Settings, destination: Destination, **options: Any) -> Loader:
    """A Loader for `destination` (options: Loader's other fields)."""
    if destination.is_lake:
        from ingestion_assets.loading.lake import LakeLoader  # deltalake loads only for a lake

        return LakeLoader(settings=settings, destination=destination, **options)
    if destination.type == "sqlalchemy":
        from ingestion_assets.loading.sql_targets import is_mysql, prepare_databases  # dlt's sqlalchemy destination

        url = destination_url(settings, destination)
        prepare_databases(url, options["target"].dataset)
        if is_mysql(url):
            from ingestion_assets.loading.sql_fidelity import MariaDbLoader

            return MariaDbLoader(settings=settings, destination=destination, **options)
    return Loader(settings=settings, destination=destination, **options)
