"""Read whole transactions from a slot in bounded batches, and acknowledge a stored checkpoint to the slot."""

from __future__ import annotations

import logging
import time

import psycopg2
from psycopg2.extensions import cursor as PgCursor

from ingestion_assets.sources.postgres.cdc.assembler import TransactionAssembler
from ingestion_assets.sources.postgres.cdc.changes import ChangeBatch
from ingestion_assets.sources.postgres.cdc.copydata import CopyBoth
from ingestion_assets.sources.postgres.cdc.errors import AcknowledgeTimeout, CdcError, DecodeTimeout, SlotInUseError
from ingestion_assets.sources.postgres.cdc.lsn import format_lsn, parse_lsn, to_lsn
from ingestion_assets.sources.postgres.cdc.replication import (
    ReplicationStream,
    protocol_version,
    replication_connection,
)
from ingestion_assets.sources.postgres.cdc.slots import slot_row, wait_until_free
from ingestion_assets.sources.postgres.reader import connect

log = logging.getLogger(__name__)
POLL_SECONDS = 0.5
DECODE_WAIT_SECONDS = 600.0  # how long a read waits for the server to decode a transaction before anything arrives


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
    decode_wait_seconds: float = DECODE_WAIT_SECONDS,
) -> ChangeBatch:
    """Whole transactions committed after `start_lsn` (the stored checkpoint; None: the slot's position).

    Stops after the transaction that reaches `max_changes` (one bigger transaction comes whole), after
    `max_seconds` (later if the first transaction is still arriving), or, with `until_caught_up`, once it
    has read up to the server's WAL position of when it started. Nothing is acknowledged: store
    `batch.end_lsn` as the checkpoint after loading the batch, then call `acknowledge`.

    With `streaming`, the server sends transactions bigger than logical_decoding_work_mem while they
    run; they are held here until they commit. Without it the server spills them to disk and sends
    them at commit, so memory here is the same either way: one batch.

    A server that is still decoding when `max_seconds` have passed with nothing received (one transaction
    bigger than it can decode in that time, even of a table not published) is waited for, up to
    `decode_wait_seconds`: ending then would read the same WAL again in the next run and never get past it.
    Beyond that it raises DecodeTimeout, naming the position and the setting.
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
        session_seconds=max(max_seconds, decode_wait_seconds),
        work_mem_kb=work_mem_kb,
    )
    with stream:
        limits = _Limits(max_changes, max_seconds, decode_wait_seconds, until_caught_up)
        caught_up = _consume(stream, assembler, limits)
        end = assembler.completed[-1].end_lsn if assembler.completed else start
        if assembler.idle:  # every transaction committing before wal_end was sent, and is in the batch
            end = max(end, stream.wal_end)
    return ChangeBatch(
        start_lsn=start, end_lsn=max(start, end), transactions=tuple(assembler.completed), caught_up=caught_up
    )


class _Limits:
    """When a read stops: its change count, its time, and how long it waits for a server still decoding."""

    def __init__(self, max_changes: int, max_seconds: float, decode_wait: float, until_caught_up: bool) -> None:
        self.max_changes, self.until_caught_up = max_changes, until_caught_up
        self.started = time.monotonic()
        self.deadline = self.started + max_seconds
        self.decode_deadline = self.started + max(max_seconds, decode_wait)
        self.said = False


def _consume(stream: ReplicationStream, assembler: TransactionAssembler, limits: _Limits) -> bool:
    """Feed messages to the assembler until a limit; True if it stopped because it caught up."""
    while True:
        now = time.monotonic()
        # Past the read's time, wait for what is still coming (an open transaction, a server decoding), not spin.
        left = limits.deadline - now if now < limits.deadline else limits.decode_deadline - now
        item = stream.next(timeout=min(left, POLL_SECONDS) if left > 0 else POLL_SECONDS)
        if item is not None:
            assembler.feed(item[1])
        if assembler.change_count >= limits.max_changes:
            return False
        if limits.until_caught_up and assembler.idle and stream.wal_end >= stream.server_lsn:
            return True
        if time.monotonic() < limits.deadline or not (assembler.completed or assembler.idle):
            continue
        if assembler.completed or stream.wal_end >= stream.server_lsn or not _still_decoding(stream, limits):
            return False


def _still_decoding(stream: ReplicationStream, limits: _Limits) -> bool:
    """Nothing has arrived and the server has not reached the WAL position it had at the start: it is
    decoding a transaction bigger than the read's time. Wait for it (a run that stopped here would decode
    the same WAL next time, and again), up to the decode limit; then say where and what to change."""
    now = time.monotonic()
    if now >= limits.decode_deadline:
        raise DecodeTimeout(
            f"replication slot {stream.slot!r}: nothing arrived from {format_lsn(stream.start_lsn)} within "
            f"{now - limits.started:.0f} s while the server's WAL reaches {format_lsn(stream.server_lsn)}: a "
            "transaction there takes longer to decode (a bulk load or a table rewrite, even of a table not "
            "published). Nothing was lost; raise cdc.max_seconds (or the read's decode wait) and run again"
        )
    if not limits.said:
        limits.said = True
        log.info(
            "slot %s: the server is still decoding WAL after %s (up to %s); waiting up to %.0f s",
            stream.slot,
            format_lsn(stream.start_lsn),
            format_lsn(stream.server_lsn),
            limits.decode_deadline - now,
        )
    return True


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
        CopyBoth(conn).send_status(target)
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
