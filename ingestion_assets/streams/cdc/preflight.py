"""Before a CDC run reads the log: every check, read-only; then the publication made or extended; and the
streams whose table lost its replica identity paused."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ingestion_assets.sources.postgres.cdc import check_cdc, drop_unread_tables, ensure_publication, parse_lsn
from ingestion_assets.sources.postgres.cdc.identity import unpublish_unidentified
from ingestion_assets.sources.postgres.cdc.marks import publication_marks
from ingestion_assets.sources.postgres.reader import connect
from ingestion_assets.streams.cdc.outcome import CdcError
from ingestion_assets.streams.cdc.paused import PAUSED, pause_message, unread_message

if TYPE_CHECKING:
    from ingestion_assets.streams.cdc.sync import CdcSync

SLOT_RELEASE_SECONDS = 10.0


def preflight(sync: CdcSync, url: str, marks: bool = True) -> tuple[tuple[str, str], ...]:
    """Every check first, read-only; only a source that passes them all gets its publication made or
    extended (returns the tables it added); with `marks` (a live run) the tables' publication marks are read
    after it, on the same connection, into `sync.marks`. A table that fails (no key, no replica identity) is never
    published: publishing it would make the source application's own UPDATEs and DELETEs on it fail."""
    # First (it only takes tables out of the product's own publication, which never harms the source): a table
    # no stream of the catalog reads leaves it, also when a check below refuses the run.
    if sync.source.cdc.publication is None:
        read = [(spec.schema_name, spec.table_name) for spec in sync.source.streams.values()]
        dropped = drop_unread_tables(url, sync.publication, read)
        if dropped:
            left = ", ".join(".".join(t) for t in dropped)
            sync._say(
                "%s: no stream reads %s any more: taken out of %s (its target table is kept as it was)",
                sync.source_name,
                left,
                sync.publication,
            )
    check(sync, url, expect_slot=False, new=_new_streams(sync))
    conn = connect(url, "ingest-cdc-admin")  # one connection for the publication and its marks
    try:
        owned = sync.source.cdc.publication is None
        ensured = ensure_publication(url, sync.publication, sync.tables(), partition_root=True, owned=owned, conn=conn)
        if ensured.replaced is not None:
            sync.own_versions.add(ensured.replaced)  # its own ALTER PUBLICATION (publish_via_partition_root): no news
        if marks:  # as they are now, the run's own ALTER included (compared by `recopy_republished`)
            sync.marks = publication_marks(url, sync.publication, sync.tables(), conn=conn)
    finally:
        conn.close()
    added = ensured.added
    if added:
        published = ", ".join(".".join(t) for t in added)
        sync._say("%s: published %s in %s", sync.source_name, published, sync.publication)
    return tuple(added)


def slot_ready(sync: CdcSync, url: str) -> None:
    check(sync, url, expect_slot=True)


def _new_streams(sync: CdcSync) -> list[str]:
    """The streams without a position in a source whose log runs for others (added to the catalog, say)."""
    if not sync._state.started:
        return []
    return [s.qualified_name for s in sync.streams if sync._state.positions.get(s.name) is None]


def check(sync: CdcSync, url: str, expect_slot: bool, new: list[str] | None = None) -> None:
    """Raises with every problem found. A problem of the table of one of the `new` streams (no replica identity,
    missing, a declared key that fails its check) leaves that stream out of the run instead (`sync.refused`; its
    table is not published) and the others go on: it holds no position yet, so nothing of it is lost, and the
    next run checks it again."""
    deadline = time.monotonic() + SLOT_RELEASE_SECONDS
    tables, keys = sync.tables(), sync.declared_keys()
    problems = check_cdc(url, sync.slot, sync.publication, tables, expect_slot, True, keys)
    for name in new or []:
        found = [p for p in problems if p.table is not None and p.table in _tables_only_of(sync, name)]
        if found:
            _refuse(sync, name, "; ".join(str(p) for p in found))
            problems = [p for p in problems if p not in found]
    tables, keys = sync.tables(), sync.declared_keys()
    # The walsender of the previous run (or of a crashed one) leaves the slot a moment after its client.
    while problems and all(p.transient for p in problems) and time.monotonic() < deadline:
        time.sleep(0.25)
        problems = check_cdc(url, sync.slot, sync.publication, tables, expect_slot, True, keys)
    if problems:
        raise CdcError(
            f"source {sync.source_name} cannot capture changes (nothing was changed on the source): "
            + "; ".join(str(p) for p in problems)
        )


def _tables_only_of(sync: CdcSync, qualified: str) -> list[tuple[str, str]]:
    """The stream's table, when no other stream of the run reads it (a problem of a shared table stops them all)."""
    table = next((s.spec.schema_name, s.spec.table_name) for s in sync.streams if s.qualified_name == qualified)
    others = [s for s in sync.streams if s.qualified_name != qualified]
    return [] if any((s.spec.schema_name, s.spec.table_name) == table for s in others) else [table]


def pause_unidentified(sync: CdcSync, url: str, stored: dict[str, Any]) -> dict[str, str]:
    """Streams whose table lost its replica identity after it was published (a primary key dropped): the
    table leaves the product's publication at once (the application's UPDATE and DELETE on it fail while
    it is published), the stream is paused and left out of this run, and its checkpoint holds no position:
    once the table has an identity again it is copied again. A table never streamed is not paused: the
    pre-flight check refuses it before anything is published."""
    owned = sync.source.cdc.publication is None
    found = unpublish_unidentified(url, sync.publication, sync.tables(), owned)
    by_table = {(s.spec.schema_name, s.spec.table_name): s for s in sync.streams}
    paused: dict[str, str] = {}
    for entry in found:
        stream = by_table.get(entry.table)
        if stream is None:  # read by no stream any more: out of the publication, nothing to pause
            if entry.removed:
                sync._say("%s", unread_message(sync.source_name, sync.publication, entry))
            continue
        checkpoint = stored.get(stream.name) or {}
        if not (entry.published or checkpoint.get("snapshot_done") or checkpoint.get(PAUSED)):
            continue
        paused[stream.name] = pause_message(sync.source_name, stream.name, sync.publication, entry)
        sync._say("%s", paused[stream.name])
        if not checkpoint.get(PAUSED):
            lsn = parse_lsn(str(checkpoint["lsn"])) if checkpoint.get("lsn") else 0
            sync.store.commit(lsn, {stream.name: {"snapshot_done": False, PAUSED: paused[stream.name]}})
    sync.streams = [s for s in sync.streams if s.name not in paused]
    return paused


def _refuse(sync: CdcSync, qualified: str, problem: str) -> None:
    stream = next(s for s in sync.streams if s.qualified_name == qualified)
    sync.refused[stream.name] = (
        f"stream {qualified} is left out of this run (nothing of it was published, read or stored): {problem}. "
        "The other streams of the source go on; the next run checks it again and copies its table once it passes"
    )
    sync._say("%s", sync.refused[stream.name])
    sync.streams = [s for s in sync.streams if s is not stream]
    sync._state.positions.pop(stream.name, None)
