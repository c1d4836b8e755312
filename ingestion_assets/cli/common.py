"""Helpers the `ingest` subcommands share."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from ingestion_assets.catalog import Catalog, CatalogError, load_catalog
from ingestion_assets.partitions import LIVE
from ingestion_assets.settings import Settings

DEFINITIONS_MODULE = "ingestion_assets.definitions"


def checkpoint_partition(source: Any, partition: str | None = None) -> str | None:
    """Where a stream's checkpoint (position, schema, acceptance) lives when no partition is named: a CDC source
    with history partitions keeps it on `live`."""
    if partition is not None:
        return partition
    cdc = getattr(source, "cdc", None)
    history = getattr(source, "mode", None) == "cdc" and getattr(cdc, "history_chunk", None) is not None
    return LIVE if history else None


def stream_key(catalog: Catalog, name: str) -> tuple[str, str]:
    source, _, stream = name.replace("/", ".").partition(".")
    known = {(s, t) for s, _, t, _ in catalog.streams()}
    if (source, stream) not in known:
        names = ", ".join(sorted(f"{s}.{t}" for s, t in known))
        raise SystemExit(f"error: no stream {name!r} in the catalog; streams: {names}")
    return source, stream


def bring_up(settings: Settings) -> dict[str, str]:
    from ingestion_assets.stack.instance import bring_up
    from ingestion_assets.state.summary import size_pools

    was_running = settings.embedded.is_running()
    env = bring_up(settings, warn=lambda said: print(f"WARNING: {said}", file=sys.stderr))
    if not was_running and settings.embedded.is_running():  # say so: the user may have stopped it on purpose
        print(f"started the embedded PostgreSQL under {settings.home} (`ingest down` stops it)", file=sys.stderr)
    try:
        catalog = load_catalog(settings.catalog_path)
    except CatalogError as exc:
        print(f"warning: {exc}", file=sys.stderr)
        return env
    size_pools(settings, catalog)
    if uses_demo_api(catalog):
        from ingestion_assets.stack.demo_api import DemoApiProcess

        DemoApiProcess.for_settings(settings).ensure_running()
    return env


def uses_demo_api(catalog: Catalog) -> bool:
    from ingestion_assets.catalog import Reference, RestSource

    return any(
        isinstance(s, RestSource) and isinstance(s.base_url, Reference) and s.base_url.service == "demo_api"
        for s in catalog.sources.values()
    )


def exports(env: dict[str, str]) -> str:
    return "\n".join(f"export {key}={shlex.quote(value)}" for key, value in env.items())


def sibling(executable: str) -> str:
    """The console script installed beside this interpreter (the project's venv), else from PATH."""
    candidate = Path(sys.executable).parent / executable
    return str(candidate) if candidate.exists() else executable
