"""The log into the streams' targets: batches read from the slot, each loaded, checkpointed, then
acknowledged; a stream being copied takes only what its copy's snapshot does not see."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ingestion_assets.sources.postgres.cdc import (
    ChangeBatch,
    RowChange,
    acknowledge,
    format_lsn,
    read_changes,
    slot_health,
)
from ingestion_assets.sources.postgres.cdc.chunks import wal_insert_position
from ingestion_assets.streams.cdc.apply import load_changes
from ingestion_assets.streams.cdc.history import Fences
from ingestion_assets.streams.cdc.outcome import CdcError, CdcOutcome, LogBehind
from ingestion_assets.streams.cdc.paused import RECOPY
from ingestion_assets.streams.cdc.preflight import slot_ready
from ingestion_assets.streams.cdc.rows import SourceRows, TableChanges
from ingestion_assets.streams.cdc.schema import SCHEMA
from ingestion_assets.streams.postgres_table import PostgresTableStream
from ingestion_assets.streams.schema_step import COLUMN_IDS
from ingestion_assets.sync import Faults, checkpoint_first

if TYPE_CHECKING:
    from ingestion_assets.streams.cdc.schema import StreamParts
    from ingestion_assets.streams.cdc.sync import CdcSync

BEHIND_BYTES = 16 * 2**20  # WAL to decode before a copy's next range that is worth telling the operator
REACH_SECONDS = 120.0  # a chunk run waits this long for the log to reach its snapshot's WAL position


def apply_log(
    sync: CdcSync, url: str, outcome: CdcOutcome, reach: int | None = None, fences: Fences | None = None
) -> None:
    """Batches of the log, each loaded, checkpointed, then acknowledged. With `reach` (a copy's snapshot),
    go on until every transaction committed before that WAL position is applied, and show each to `fences`."""
    slot_ready(sync, url)
    faults = sync.faults or Faults.from_env()
    unsafe = checkpoint_first()
    deadline = time.monotonic() + REACH_SECONDS
    session = sync.source.cdc.max_seconds
    index = 0
    while reach is not None or index < sync.source.cdc.max_batches_per_run:
        if reach is not None and outcome.lsn >= reach:
            break
        batch = read_changes(
            url,
            sync.slot,
            sync.publication,
            outcome.lsn,
            max_changes=sync.source.cdc.max_changes,
            max_seconds=session,
        )
        if batch.end_lsn <= outcome.lsn and not batch.transactions:
            if reach is None:
                break
            _wait_for_wal(sync, reach, outcome.lsn, deadline)
            # A session decodes from the slot's restart position: one big transaction (a bulk load, even
            # of a table not published) may need longer than max_seconds before anything arrives.
            session = min(session * 2, REACH_SECONDS)
            continue
        deadline, session = time.monotonic() + REACH_SECONDS, sync.source.cdc.max_seconds
        if sync._applied is not None:
            sync._applied.extend(tx.xid % 2**32 for tx in batch.transactions)
        if fences is not None:
            fences.see(batch)
        if unsafe:  # never in production: checkpoint first, so a crash in the load loses the batch
            sync._commit(batch.end_lsn)
        faults.hit("before_load", index)
        apply_batch(sync, url, batch, outcome, fences)
        faults.hit("after_load", index)
        if not unsafe:
            sync._commit(batch.end_lsn)
        faults.hit("after_checkpoint", index)
        acknowledge(url, sync.slot, sync.publication, batch.end_lsn)  # only behind stored checkpoints
        outcome.lsn = batch.end_lsn
        index += 1
        if reach is None and (batch.caught_up or sync.stop()):
            break
    outcome.health = slot_health(url, sync.slot)


def catch_up(sync: CdcSync, url: str, outcome: CdcOutcome, before: str) -> None:
    """The log up to where the server writes now, with no snapshot held: a snapshot held open holds back
    vacuum on the whole source, so a copy's snapshot is then held only while the changes written since
    are applied and its rows read (found by the CDC attack: 12 minutes held with a 1 GB backlog)."""
    now = wal_insert_position(url)
    if now <= outcome.lsn:
        return
    if now - outcome.lsn > BEHIND_BYTES:
        behind = f"{(now - outcome.lsn) / 2**20:,.0f} MB"
        sync._say("%s: applying %s of log before %s", sync.source_name, behind, before)
    apply_log(sync, url, outcome, reach=now)


def _wait_for_wal(sync: CdcSync, reach: int, at: int, deadline: float) -> None:
    if time.monotonic() > deadline:
        raise LogBehind(
            f"source {sync.source_name}: the slot {sync.slot} stayed at {format_lsn(at)} for "
            f"{REACH_SECONDS:.0f} s, short of the snapshot's position {format_lsn(reach)} (a transaction of "
            "that size may take longer to decode: raise cdc.max_seconds); "
            "nothing was loaded from the copy, retry the run"
        )
    time.sleep(0.2)


def apply_batch(sync: CdcSync, url: str, batch: ChangeBatch, outcome: CdcOutcome, fences: Fences | None) -> None:
    by_table = {(s.spec.schema_name, s.spec.table_name): s for s in sync.streams}
    pending: dict[str, TableChanges] = {}
    source_rows = SourceRows(url)
    try:
        _gather(sync, batch, by_table, pending, source_rows, fences)
    finally:
        source_rows.close()
    load_changes(sync, pending, outcome)  # one load for every table where the destination allows it


def _gather(
    sync: CdcSync,
    batch: ChangeBatch,
    by_table: dict[tuple[str, str], PostgresTableStream],
    pending: dict[str, TableChanges],
    source_rows: SourceRows,
    fences: Fences | None,
) -> None:
    for tx in batch.transactions:
        for change in tx.changes:
            stream = by_table.get((change.table.schema, change.table.table))
            if stream is None or not _wants(sync, stream.name, tx.xid, tx.end_lsn, fences):
                continue
            if stream.name in sync._state.copies and sync._parts(stream).outdated(stream, change.table):
                # Made before the type change that (this run, or the next one) copies the table again:
                # every range's snapshot sees it, so the copy brings what it left and retires what it deleted.
                continue
            # A copy under way rebuilds the target anyway: the truncate empties what it copied so far, and
            # later ranges and the log bring what the table holds after it.
            refused = stream.spec.truncate == "refuse" and stream.name not in sync._state.copies
            if change.op.value == "truncate" and refused:
                raise CdcError(
                    f"stream {stream.qualified_name}: the source table was truncated at "
                    f"{format_lsn(change.commit_lsn)} and the stream refuses truncates (it would empty the "
                    f"target). Set `truncate: apply` to follow it, or copy the table again with `ingest state "
                    f"reset {stream.qualified_name}`; nothing after it was applied"
                )
            parts = sync._parts(stream)
            if stream.name not in sync._state.copies and _logged_without_columns(sync, stream, parts, change):
                continue
            changes = pending.get(stream.name)
            if changes is None:
                key = tuple(stream.spec.primary_key)
                generated = parts.generated_columns(stream)
                changes = TableChanges(
                    parts.shape,
                    key,
                    soft=stream.spec.deletes == "soft",
                    generated=generated,
                    max_value_bytes=stream.spec.dead_letters.max_value_bytes,
                    null_bad=stream.spec.dead_letters.on_bad_value == "null",
                )
                pending[stream.name] = changes
            changes.add(change, source_rows.lookup(stream, parts.shape))


def _logged_without_columns(sync: CdcSync, stream: PostgresTableStream, parts: StreamParts, change: RowChange) -> bool:
    """A change the log wrote without a column the table has now (renamed and renamed back, or dropped and added
    again, since): its row cannot say that column's value, and applying it would load NULL there. The stream is
    copied again instead, from the next run on (stored now: a crash before the run's checkpoint keeps it), and
    takes nothing more of the log in this run."""
    known = parts.complete_relations.get(id(change.table))
    if known is not None and known[0] is change.table and known[1] is parts.shape:
        return False  # this relation message was checked against this shape already (asked for every change)
    generated = parts.generated_columns(stream)
    logged = set(change.table.columns)
    missing = [c for c in parts.shape.column_names if c not in logged and c not in generated]
    if not missing:
        parts.complete_relations[id(change.table)] = (change.table, parts.shape)
        return False
    position = sync._state.positions.get(stream.name)
    reason = (
        f"the log wrote a change at {format_lsn(change.commit_lsn)} without column(s) {', '.join(missing)} (renamed "
        "and renamed back, or dropped and added again, while the log was written): its rows cannot say those "
        "values"
    )
    if position is not None:  # the schema the target holds stays: the next run compares the columns with it
        kept = {k: v for k, v in sync._details(stream.name).items() if k in (SCHEMA, COLUMN_IDS)}
        sync.store.commit(position, {stream.name: {**kept, "snapshot_done": False, RECOPY: reason}})
    sync._state.recopy(stream.name, reason)
    sync._say("%s: copying its table again from the next run: %s", stream.qualified_name, reason)
    return True


def _wants(sync: CdcSync, name: str, xid: int, end_lsn: int, fences: Fences | None) -> bool:
    """A stream being copied takes only what its copy's snapshot does not see; the others what their own
    checkpoint is not past yet."""
    if sync._state.positions.get(name) is None:
        return fences is not None and not fences.snapshot.sees(xid)
    return not sync._state.applied(name, end_lsn)
