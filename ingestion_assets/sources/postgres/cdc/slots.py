"""Replication slots: their state, WAL they retain, gaps in what they can still deliver, and dropping them."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import psycopg2
from psycopg2.extensions import cursor as PgCursor

from ingestion_assets.sources.postgres.cdc.errors import SlotInUseError, SlotMissingError
from ingestion_assets.sources.postgres.cdc.lsn import format_lsn, parse_lsn
from ingestion_assets.sources.postgres.reader import connect

# to_jsonb(row) keeps one query across server versions: wal_status/safe_wal_size came in 13,
# conflicting in 16, invalidation_reason in 17.
_SLOT_ROW = "SELECT to_jsonb(s), current_database() FROM pg_replication_slots s WHERE slot_name = %s"
_SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")
_CURRENT_LSN = "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END"


def valid_slot_name(slot: str) -> str:
    """PostgreSQL's own rule for slot names, checked before any connection is made."""
    if not _SLOT_NAME.match(slot):
        raise ValueError(
            f"replication slot name {slot!r} is invalid: use 1-63 lower case letters, digits and underscores"
        )
    return slot


def slot_row(cur: PgCursor, slot: str) -> dict[str, Any] | None:
    """The slot's pg_replication_slots row (plus `current_database`), None if there is no such slot."""
    cur.execute(_SLOT_ROW, (slot,))
    row = cur.fetchone()
    if row is None:
        return None
    return {**row[0], "current_database": row[1]}


def _lsn(value: str | None) -> int | None:
    return None if value is None else parse_lsn(value)


@dataclass(frozen=True)
class SlotHealth:
    slot: str
    active: bool
    active_pid: int | None
    current_lsn: int  # the server's WAL position now
    restart_lsn: int | None  # oldest WAL the slot keeps (None once invalidated)
    confirmed_flush_lsn: int | None  # the position acknowledged by the consumer
    retained_wal_bytes: int  # WAL kept on disk for this slot: current - restart
    lag_bytes: int  # WAL written since the last acknowledgement: current - confirmed
    wal_status: str | None  # reserved, extended, unreserved or lost
    safe_wal_size: int | None  # bytes until the slot may lose WAL; None when max_slot_wal_keep_size = -1
    invalidation_reason: str | None


def slot_health(url: str, slot: str) -> SlotHealth:
    conn = connect(url, "ingest-cdc-health")
    try:
        with conn.cursor() as cur:
            row = slot_row(cur, slot)
            cur.execute(_CURRENT_LSN)
            current = parse_lsn(cur.fetchone()[0])
    finally:
        conn.close()
    if row is None:
        raise SlotMissingError(f"replication slot {slot!r} does not exist")
    restart, confirmed = _lsn(row["restart_lsn"]), _lsn(row["confirmed_flush_lsn"])
    reason = row.get("invalidation_reason") or ("conflicting" if row.get("conflicting") else None)
    return SlotHealth(
        slot=slot,
        active=bool(row["active"]),
        active_pid=row["active_pid"],
        current_lsn=current,
        restart_lsn=restart,
        confirmed_flush_lsn=confirmed,
        retained_wal_bytes=max(0, current - restart) if restart is not None else 0,
        lag_bytes=max(0, current - confirmed) if confirmed is not None else 0,
        wal_status=row.get("wal_status"),
        safe_wal_size=row.get("safe_wal_size"),
        invalidation_reason=reason,
    )


@dataclass(frozen=True)
class WalGap:
    """The slot cannot deliver every change after the saved checkpoint: take a new snapshot."""

    slot: str
    saved_lsn: int
    reason: str
    acknowledged_lsn: int | None = None  # the slot is there but past the checkpoint: only streams behind it lost

    def __str__(self) -> str:
        return self.reason


def find_gap(url: str, slot: str, saved_lsn: int) -> WalGap | None:
    """None if the slot can still deliver every change committed after `saved_lsn`, else why not."""
    saved = format_lsn(saved_lsn)
    fix = "changes after it are lost to this slot; drop the slot and take a new snapshot (a full refresh)"
    try:
        health = slot_health(url, slot)
    except SlotMissingError:  # dropped (`ingest cdc drop-slot`, by hand): nothing left to drop, a snapshot to take
        return WalGap(
            slot,
            saved_lsn,
            f"replication slot {slot!r} no longer exists (checkpoint {saved}): the changes after the checkpoint went "
            "with it; a new snapshot (a full refresh) is needed, and the next run that takes one creates the slot",
        )
    if health.wal_status == "lost" or health.invalidation_reason or health.restart_lsn is None:
        why = health.invalidation_reason or f"wal_status={health.wal_status}"
        return WalGap(
            slot,
            saved_lsn,
            f"replication slot {slot!r} was invalidated ({why}): the server removed WAL it still needed; {fix}; "
            "raise max_slot_wal_keep_size or read more often to keep it from happening again",
        )
    confirmed = health.confirmed_flush_lsn or 0
    if saved_lsn < confirmed:
        return WalGap(
            slot,
            saved_lsn,
            f"replication slot {slot!r} was acknowledged up to {format_lsn(confirmed)}, past the stored checkpoint "
            f"{saved} (it was created again by a run of other streams, another consumer reads it, or it was "
            "acknowledged before the checkpoint was stored): changes after the checkpoint are lost to this slot",
            acknowledged_lsn=confirmed,
        )
    return None


def wait_until_free(cur: PgCursor, slot: str, seconds: float) -> dict[str, Any]:
    """The slot's row once no process streams from it; a reader that just closed takes a moment to let go."""
    deadline = time.monotonic() + seconds
    while True:
        row = slot_row(cur, slot)
        if row is None:
            raise SlotMissingError(
                f"replication slot {slot!r} does not exist in this server (dropped while the run held it?): `ingest "
                "cdc status SOURCE` says what the next run does"
            )
        if not row["active"] or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    if row["active"]:
        pid = row["active_pid"]
        raise SlotInUseError(
            f"replication slot {slot!r} is in use by process {pid}; stop the other reader, "
            f"or end it with SELECT pg_terminate_backend({pid})"
        )
    return row


def drop_slot(url: str, slot: str, wait_seconds: float = 10.0) -> bool:
    """Drop the slot (it retains WAL until dropped); False if it did not exist."""
    conn = connect(url, "ingest-cdc-admin")
    try:
        with conn.cursor() as cur:
            try:
                wait_until_free(cur, slot, wait_seconds)
            except SlotMissingError:
                return False
            try:
                cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            except psycopg2.errors.UndefinedObject:
                return False
    finally:
        conn.close()
    return True
