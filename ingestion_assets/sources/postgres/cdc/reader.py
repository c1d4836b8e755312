"""Read whole transactions from a slot in bounded batches, and acknowledge a stored checkpoint to the slot."""

from __future__ import annotations

import time

import psycopg2
from psycopg2.extensions import cursor as PgCursor

from ingestion_assets.sources.postgres.cdc.assembler import TransactionAssembler
from ingestion_assets.sources.postgres.cdc.changes import ChangeBatch
from ingestion_assets.sources.postgres.cdc.errors import AcknowledgeTimeout, CdcError, SlotInUseError
from ingestion_assets.sources.postgres.cdc.lsn import format_lsn, parse_lsn, to_lsn
from ingestion_assets.sources.postgres.cdc.replication import (
    ReplicationStream,
    protocol_version,
    replication_connection,
)
from ingestion_assets.sources.postgres.cdc.slots import slot_row, wait_until_free
from ingestion_assets.sources.postgres.reader import connect

POLL_SECONDS = 0.5


def read_changes(
    url: str,
    slot: str,
    publication: str,
    start_lsn: int | str | None,
    *,
    max_changes: int = 10_000,
    max_seconds: float = 30.0,
    until_caught_up: bool = True,
    streaming: bool = False,
    messages: bool = False,
    work_mem_kb: int | None = None,
) -> ChangeBatch:
    """Whole transactions committed after `start_lsn` (the stored checkpoint; None: the slot's position).

    Stops after the transaction that reaches `max_changes` (one bigger transaction comes whole), after
    `max_seconds` (later if the first transaction is still arriving), or, with `until_caught_up`, once it
    has read up to the server's WAL position of when it started. Nothing is acknowledged: store
    `batch.end_lsn` as the checkpoint after loading the batch, then call `acknowledge`.

    With `streaming`, the server sends transactions bigger than logical_decoding_work_mem while they
    run; they are held here until they commit. Without it the server spills them to disk and sends
    them at commit, so memory here is the same either way: one batch.
    """
    if max_changes < 1 or max_seconds <= 0:
        raise ValueError(f"max_changes ({max_changes}) and max_seconds ({max_seconds}) must be positive")
    start = to_lsn(start_lsn)
    assembler = TransactionAssembler()
    stream = ReplicationStream(
        url,
        slot,
        publication,
        start,
        streaming=streaming,
        messages=messages,
        session_seconds=max_seconds,
        work_mem_kb=work_mem_kb,
    )
    with stream:
        caught_up = _consume(stream, assembler, max_changes, time.monotonic() + max_seconds, until_caught_up)
        end = assembler.completed[-1].end_lsn if assembler.completed else start
        if assembler.idle:  # every transaction committing before wal_end was sent, and is in the batch
            end = max(end, stream.wal_end)
    return ChangeBatch(
        start_lsn=start, end_lsn=max(start, end), transactions=tuple(assembler.completed), caught_up=caught_up
    )


def _consume(
    stream: ReplicationStream, assembler: TransactionAssembler, max_changes: int, deadline: float, until_caught_up: bool
) -> bool:
    """Feed messages to the assembler until a limit; True if it stopped because it caught up."""
    while True:
        item = stream.next(timeout=max(0.0, min(deadline - time.monotonic(), POLL_SECONDS)))
        if item is not None:
            assembler.feed(item[1])
        if assembler.change_count >= max_changes:
            return False
        if until_caught_up and assembler.idle and stream.wal_end >= stream.server_lsn:
            return True
        if time.monotonic() >= deadline and (assembler.completed or assembler.idle):
            return False


def acknowledge(url: str, slot: str, publication: str, lsn: int | str, timeout: float = 30.0) -> None:
    """Tell the slot that everything before `lsn` is stored, so the server may release that WAL.

    Call it only after the checkpoint `lsn` is durably stored: the slot never sends those changes again.
    A position at or behind the slot's is left alone (a slot never moves back). `publication` is needed
    only because pgoutput refuses to start without one.
    """
    target = to_lsn(lsn)
    admin = connect(url, "ingest-cdc-ack")
    try:
        with admin.cursor() as cur:
            row = wait_until_free(cur, slot, timeout)
            if row["confirmed_flush_lsn"] is not None and parse_lsn(row["confirmed_flush_lsn"]) >= target:
                return
            _send_flush(url, slot, publication, target, cur, timeout)
    finally:
        admin.close()


def _send_flush(url: str, slot: str, publication: str, target: int, admin_cur: PgCursor, timeout: float) -> None:
    conn = replication_connection(url, timeout)
    try:
        cur = conn.cursor()
        options = {"proto_version": str(protocol_version(conn.server_version)), "publication_names": publication}
        try:
            cur.start_replication(slot_name=slot, decode=False, start_lsn=target, options=options, status_interval=10)
        except psycopg2.errors.ObjectInUse as exc:
            raise SlotInUseError(f"replication slot {slot!r} was taken by another reader while acknowledging") from exc
        cur.send_feedback(flush_lsn=target, force=True)
        _wait_confirmed(admin_cur, slot, target, timeout)
    finally:
        conn.close()


def _wait_confirmed(cur: PgCursor, slot: str, target: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = slot_row(cur, slot)
        if row is None:
            raise CdcError(f"replication slot {slot!r} was dropped while acknowledging {format_lsn(target)}")
        if row["confirmed_flush_lsn"] is not None and parse_lsn(row["confirmed_flush_lsn"]) >= target:
            return
        time.sleep(0.02)
    raise AcknowledgeTimeout(
        f"replication slot {slot!r} did not confirm {format_lsn(target)} within {timeout:.0f} s; "
        "reads still resume from the stored checkpoint; retry acknowledge so the server can release WAL"
    )
