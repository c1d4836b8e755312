"""Which streams of a CDC source need their table copied again, and why: columns or target changed,
partitions moved, the log no longer holding their changes (a stream back in the catalog, a WAL gap)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion_assets.partitions import LIVE
from ingestion_assets.sources.postgres.cdc import WalGap, drop_slot, find_gap, format_lsn
from ingestion_assets.sources.postgres.cdc.marks import PUBLISHED, marks_changed
from ingestion_assets.streams.cdc.batches import catch_up
from ingestion_assets.streams.cdc.outcome import CdcError, CdcOutcome
from ingestion_assets.streams.cdc.schema import settle_stream
from ingestion_assets.streams.postgres_table import PostgresTableStream

if TYPE_CHECKING:
    from ingestion_assets.streams.cdc.sync import CdcSync


def settle_streams(sync: CdcSync) -> None:
    """Per stream: its schema against the stored one, and its target against its checkpoint. A stream whose
    columns changed or whose target does not hold what its checkpoint says is copied again (and says why)."""
    partition = LIVE if sync.history else None
    for stream in sync.streams:
        details = sync._state.details(stream.name)
        parts = settle_stream(stream, details, partition, sync.history)
        sync._streams[stream.name] = parts
        if sync._state.positions.get(stream.name) is not None and parts.recopy:
            recopy(sync, stream, parts.recopy)


def recopy_stale(sync: CdcSync, url: str, published: tuple[tuple[str, str], ...]) -> None:
    """Streams whose checkpoint the log can no longer serve while the slot still serves the others get a
    fresh copy, as a new stream does: a stream back in the catalog after a while out of it (its table was
    taken out of the publication meanwhile, so the log holds none of its changes since; or the slot was
    acknowledged past its checkpoint by the runs of the other streams)."""
    for stream in sync.streams:
        table = (stream.spec.schema_name, stream.spec.table_name)
        if table in published and sync._state.positions.get(stream.name) is not None:
            why = f"its table was not in the publication {sync.publication} (the stream was out of the catalog?)"
            recopy(sync, stream, f"{why}: the log holds none of its changes since its checkpoint")
    if not sync._state.started:
        return
    gap = find_gap(url, sync.slot, sync._state.low)
    acknowledged = gap.acknowledged_lsn if gap is not None else None
    if acknowledged is None or not any(p is not None and p >= acknowledged for p in sync._state.positions.values()):
        return  # the slot serves every stream, or none: a WAL gap of the source (`resync_at_gap`)
    for stream in sync.streams:
        position = sync._state.positions.get(stream.name)
        if position is not None and position < acknowledged:
            recopy(
                sync,
                stream,
                f"its checkpoint {format_lsn(position)} is behind the slot {sync.slot}, which the runs of the "
                f"other streams acknowledged up to {format_lsn(acknowledged)} (the stream was out of the "
                "catalog?): the log no longer holds its changes in between",
            )


def recopy_republished(sync: CdcSync) -> None:
    """Streams whose publication or enum labels changed since their checkpoint in a way the log cannot show (an
    operator's ALTER PUBLICATION: publish options narrowed, the table dropped and added back, a row filter set,
    even if restored since; a refused run stores nothing, so the restore is seen too; ALTER TYPE ... RENAME VALUE)
    get a fresh copy. A checkpoint without marks (stored before they were kept) only takes the current ones. The
    marks now are those the run's preflight read after its own ALTER PUBLICATION, on the same connection."""
    for stream in sync.streams:
        stored = sync._state.details(stream.name).get(PUBLISHED)
        now = sync.marks[(stream.spec.schema_name, stream.spec.table_name)]
        if sync._state.positions.get(stream.name) is None or not isinstance(stored, dict):
            continue
        why = marks_changed(sync.publication, stored, now, sync.own_versions)
        if why:
            recopy(sync, stream, why)


def recopy_rewritten(sync: CdcSync, url: str, outcome: CdcOutcome) -> None:
    """Streams with a partition rewritten outside the log (a TRUNCATE of that partition, which the log does not
    carry through the partitioned table; also VACUUM FULL or CLUSTER, which a copy leaves exact): the log is
    applied up to now first, so a TRUNCATE of the whole table it carries is applied or refused as the stream
    says, then the table is copied again and the rows the copy does not find retire."""
    rewritten = [
        (stream, parts)
        for stream in sync.streams
        if (parts := sync._streams.get(stream.name)) is not None
        and parts.rewritten
        and sync._state.positions.get(stream.name) is not None
    ]
    if not rewritten:
        return
    catch_up(sync, url, outcome, f"the copy of {', '.join(s.qualified_name for s, _ in rewritten)}")
    for stream, parts in rewritten:
        why, parts.rewritten = parts.rewritten, None
        recopy(sync, stream, why or "")


def recopy(sync: CdcSync, stream: PostgresTableStream, reason: str) -> None:
    sync._state.recopy(stream.name, reason)
    sync._say("%s: copying its table again: %s", stream.qualified_name, reason)


def resync_at_gap(sync: CdcSync, url: str, lsn: int) -> WalGap | None:
    """None if the slot can deliver every change after `lsn`; the gap if the slot was dropped (or was gone
    already) to start over (on_wal_gap: resync); else it stops with the commands that re-copy the source."""
    gap = find_gap(url, sync.slot, lsn)
    if gap is None:
        return None
    if sync.source.cdc.on_wal_gap == "resync" and not sync.history:
        sync._say(
            "%s: %s; resyncing every stream from a new slot %s and a fresh snapshot (on_wal_gap: resync)",
            sync.source_name,
            gap,
            sync.slot,
        )
        drop_slot(url, sync.slot)
        return gap
    behind = [s for s in sync.streams if _lost_to(sync, s.name, gap)]
    resets = ", ".join(f"`ingest state reset {sync.source_name}.{s.name}`" for s in behind or sync.streams)
    again = (
        f"Reset `live` of every stream ({resets}, each with `--partition live`), run it, then backfill the "
        "history ranges again"
        if sync.history
        else f"This source has on_wal_gap: {sync.source.cdc.on_wal_gap}. Re-copy the streams it concerns "
        f"({resets}; the next run copies them again), or set cdc.on_wal_gap: resync (the next run then makes the "
        "slot again and copies every stream)"
    )
    raise CdcError(
        f"source {sync.source_name}: the slot {sync.slot} can no longer deliver the changes after the "
        f"checkpoint {format_lsn(lsn)} ({gap}). Rows changed in between would be missed. {again}"
    )


def _lost_to(sync: CdcSync, name: str, gap: WalGap) -> bool:
    """The stream holds a position the gap took changes after (a slot acknowledged past some positions only
    concerns the streams behind it; a missing or invalidated slot concerns every stream with a position)."""
    position = sync._state.positions.get(name)
    if position is None:
        return False
    return gap.acknowledged_lsn is None or position < gap.acknowledged_lsn
