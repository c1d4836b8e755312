"""What the definitions are built from: the catalog file's path and a fingerprint of what it says.

A Celery worker compares it with the one its step was submitted under (defs/worker_checks.py); kept apart from
the worker's checks so the definitions of a deployment without Celery never import it (~0.15 s per process)."""

from __future__ import annotations

import hashlib

from ingestion_assets.catalog import Catalog, load_catalog
from ingestion_assets.settings import Settings


def catalog_identity(settings: Settings, catalog: Catalog | None = None) -> dict[str, str]:
    """The catalog file's path and the fingerprint of what it says (comments and layout aside): what the
    definitions are built from."""
    said = (catalog or load_catalog(settings.catalog_path)).model_dump_json()
    return {"fingerprint": hashlib.sha256(said.encode()).hexdigest()[:16], "path": str(settings.catalog_path)}
