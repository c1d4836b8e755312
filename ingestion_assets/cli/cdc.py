"""`ingest cdc status|drop-slot SOURCE`: the replication slot of a CDC source, with a verdict."""

from __future__ import annotations

import argparse
from contextlib import AbstractContextManager
from dataclasses import dataclass

from ingestion_assets.catalog import PostgresSource, load_catalog
from ingestion_assets.settings import Settings

MB = 1024 * 1024


@dataclass(frozen=True)
class CdcSource:
    name: str
    source: PostgresSource
    url: str
    slot: str
    publication: str

    def reaching(self) -> AbstractContextManager[None]:
        """Connection failures as one message naming the source and its reference (never the password)."""
        from ingestion_assets.sources.postgres.reader import reaching

        return reaching(self.url, f"sources.{self.name}.connection", self.source.connection.describe())


def _source(settings: Settings, name: str) -> CdcSource:
    from ingestion_assets.references import postgres_url

    catalog = load_catalog(settings.catalog_path)
    source = catalog.sources.get(name)
    if not isinstance(source, PostgresSource) or source.mode != "cdc":
        cdc = sorted(n for n, s in catalog.sources.items() if isinstance(s, PostgresSource) and s.mode == "cdc")
        raise SystemExit(f"error: {name!r} is not a cdc source of the catalog; cdc sources: {', '.join(cdc) or 'none'}")
    url = postgres_url(source.connection, source.tls, settings, f"sources.{name}.connection")
    slot = source.cdc.slot or f"ingest_{name}"
    return CdcSource(name, source, url, slot, source.cdc.publication or f"ingest_{name}")


def _checkpointed(settings: Settings, cdc: CdcSource) -> list[str]:
    """Streams of the source holding a log position (they need the slot's changes after it)."""
    return list(_positions(settings, cdc))


def _positions(settings: Settings, cdc: CdcSource) -> dict[str, int]:
    """Each stream's log position, for the streams whose copy is done (what a run reads the slot after)."""
    import dagster as dg

    from ingestion_assets.cli.common import bring_up, checkpoint_partition
    from ingestion_assets.sources.postgres.cdc import parse_lsn
    from ingestion_assets.state.checkpoints import latest_checkpoint
    from ingestion_assets.state.summary import open_instance

    partition = checkpoint_partition(cdc.source)
    bring_up(settings)
    with open_instance(settings) as instance:
        found = {s: latest_checkpoint(instance, dg.AssetKey([cdc.name, s]), partition) for s in cdc.source.streams}
    return {
        s: parse_lsn(str(c.position["lsn"]))
        for s, c in found.items()
        if c is not None and c.position is not None and c.position.get("lsn") and c.details.get("snapshot_done")
    }


def _without_slot(settings: Settings, cdc: CdcSource) -> str | None:
    """What the next run does with no slot: None if it simply starts (no stream has a position), else why
    it cannot continue and what to run."""
    held = _checkpointed(settings, cdc)
    if not held:
        return None
    lost = f"streams {', '.join(held)} hold log positions the missing slot can no longer deliver changes after"
    if cdc.source.cdc.on_wal_gap == "resync":
        return f"{lost}; the next run takes a fresh snapshot of every stream (on_wal_gap: resync)"
    resets = "; ".join(f"ingest state reset {cdc.name}.{s}" for s in held)
    return (
        f"{lost}; the next run stops (on_wal_gap: fail). Re-copy the source: {resets} (the next run then takes a "
        "fresh snapshot), or set cdc.on_wal_gap: resync"
    )


def status(settings: Settings, args: argparse.Namespace) -> int:
    """The slot's figures and a verdict against the catalog's thresholds; non-zero when unhealthy."""
    from ingestion_assets.sources.postgres.cdc import SlotMissingError, slot_health
    from ingestion_assets.streams.cdc.paused import unpublish_for_source

    cdc = _source(settings, args.source)
    with cdc.reaching():  # the application's writes on a table that lost its key fail meanwhile
        unpublished, _ = unpublish_for_source(cdc.url, cdc.name, cdc.source)
    for message in unpublished:
        print(f"warning: {message}")
    try:
        with cdc.reaching():
            health = slot_health(cdc.url, cdc.slot)
    except SlotMissingError:
        problem = _without_slot(settings, cdc)
        if problem is None:
            print(f"slot {cdc.slot} does not exist yet: the first run creates it with a snapshot")
            return 0
        print(f"slot {cdc.slot} does not exist")
        print(f"verdict: unhealthy: {problem}")
        return 1
    limit = cdc.source.cdc.max_retained_wal_mb
    print(f"slot {cdc.slot} (publication {cdc.publication}): active={health.active} wal_status={health.wal_status}")
    print(f"  retained WAL {health.retained_wal_bytes:,} bytes, lag {health.lag_bytes:,} bytes")
    problems = []
    if health.invalidation_reason or health.wal_status == "lost":
        problems.append(
            f"the slot was invalidated ({health.invalidation_reason or health.wal_status}): changes were lost; "
            + (_without_slot(settings, cdc) or "the next run takes a fresh snapshot")
        )
    if health.retained_wal_bytes > limit * MB:
        problems.append(
            f"it retains {health.retained_wal_bytes / MB:,.1f} MB of WAL, above max_retained_wal_mb ({limit:,} MB): "
            f"run the source's CDC asset (or start the sensor {cdc.name}__cdc_slot) so it acknowledges, or drop "
            f"the slot (`ingest cdc drop-slot {cdc.name} --yes`) if the source is retired"
        )
    behind = _behind_the_slot(settings, cdc, health.confirmed_flush_lsn)
    if behind:
        problems.append(behind)
    if health.wal_status == "unreserved":
        problems.append("the server is about to remove WAL the slot needs (wal_status unreserved): run it now")
    problems += unpublished
    if problems:
        print("verdict: unhealthy: " + "; ".join(problems))
        return 1
    print(f"verdict: healthy: {health.retained_wal_bytes / MB:,.1f} MB retained of max_retained_wal_mb {limit:,} MB")
    return 0


def _behind_the_slot(settings: Settings, cdc: CdcSource, confirmed: int | None) -> str | None:
    """Streams whose position the slot was acknowledged past (it was dropped and created again by a run of
    other streams, or another consumer reads it): their next run stops, as it cannot get those changes. While
    other streams hold positions the slot serves (a stream put back in the catalog), the next run copies the
    streams behind it again instead: said, and no verdict of the slot."""
    from ingestion_assets.sources.postgres.cdc import format_lsn

    if confirmed is None:
        return None
    positions = _positions(settings, cdc)
    behind = sorted(name for name, lsn in positions.items() if lsn < confirmed)
    if not behind:
        return None
    if len(behind) < len(positions):
        print(
            f"  streams {', '.join(behind)} hold log positions the slot was acknowledged past "
            f"({format_lsn(confirmed)}) by the runs of the others: the next run copies them again"
        )
        return None
    resets = "; ".join(f"ingest state reset {cdc.name}.{s}" for s in behind)
    return (
        f"streams {', '.join(behind)} hold log positions the slot was acknowledged past ({format_lsn(confirmed)}: it "
        f"was created again, or another consumer reads it), so changes after them are gone; their next run stops. "
        f"Re-copy them: {resets}"
    )


def drop_slot_command(settings: Settings, args: argparse.Namespace) -> int:
    from ingestion_assets.sources.postgres.cdc import drop_slot

    cdc = _source(settings, args.source)
    after = _without_slot(settings, cdc)
    then = f"next run: {after}" if after else "next run: creates the slot with a snapshot of every stream"
    if not args.yes:  # the changes the slot holds go with it: a dry run unless told
        print(f"slot {cdc.slot} of {cdc.name} would be dropped, with every change it still holds; {then}")
        print("dry run, nothing dropped: add --yes")
        return 0
    with cdc.reaching():
        dropped = drop_slot(cdc.url, cdc.slot)
    print(f"slot {cdc.slot} {'dropped: its WAL is released' if dropped else 'did not exist'}")
    print(then)
    return 0
