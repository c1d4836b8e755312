"""`ingest cdc status|drop-slot SOURCE`: the replication slot of a CDC source."""

from __future__ import annotations

import argparse

from ingestion_assets.catalog import PostgresSource, load_catalog
from ingestion_assets.settings import Settings


def _source(settings: Settings, name: str) -> tuple[str, str, str]:
    from ingestion_assets.references import resolve

    catalog = load_catalog(settings.catalog_path)
    source = catalog.sources.get(name)
    if not isinstance(source, PostgresSource) or source.mode != "cdc":
        cdc = sorted(n for n, s in catalog.sources.items() if isinstance(s, PostgresSource) and s.mode == "cdc")
        raise SystemExit(f"error: {name!r} is not a cdc source of the catalog; cdc sources: {', '.join(cdc) or 'none'}")
    url = resolve(source.connection, settings, f"sources.{name}.connection")
    return url, source.cdc.slot or f"ingest_{name}", source.cdc.publication or f"ingest_{name}"


def status(settings: Settings, args: argparse.Namespace) -> int:
    from ingestion_assets.sources.postgres.cdc import SlotMissingError, slot_health

    url, slot, publication = _source(settings, args.source)
    try:
        health = slot_health(url, slot)
    except SlotMissingError:
        print(f"slot {slot} does not exist yet: the first run creates it with a snapshot")
        return 0
    print(f"slot {slot} (publication {publication}): active={health.active} wal_status={health.wal_status}")
    print(f"  retained WAL {health.retained_wal_bytes:,} bytes, lag {health.lag_bytes:,} bytes")
    return 0


def drop_slot_command(settings: Settings, args: argparse.Namespace) -> int:
    from ingestion_assets.sources.postgres.cdc import drop_slot

    url, slot, _ = _source(settings, args.source)
    dropped = drop_slot(url, slot)
    print(
        f"slot {slot} {'dropped: its WAL is released' if dropped else 'did not exist'}; the next run of "
        f"{args.source} takes a fresh snapshot only after `ingest state reset` of its streams"
    )
    return 0
