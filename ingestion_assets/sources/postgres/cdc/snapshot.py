"""Create a slot together with an exported snapshot, so history copied under it meets the slot's changes exactly."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg2
from psycopg2.extensions import cursor as PgCursor

from ingestion_assets.sources.postgres.cdc.errors import CdcError
from ingestion_assets.sources.postgres.cdc.lsn import parse_lsn
from ingestion_assets.sources.postgres.cdc.replication import replication_connection
from ingestion_assets.sources.postgres.cdc.slots import drop_slot, valid_slot_name

HOLD_SECONDS = 3600.0  # how long the walsender waits on the idle exporting connection before timing out


@dataclass(frozen=True)
class SlotSnapshot:
    """Rows visible in `snapshot_name` plus the slot's changes from `consistent_lsn` on are the table, once."""

    slot: str
    consistent_lsn: int
    snapshot_name: str


def _create_command(slot: str, server_version: int) -> str:
    name = valid_slot_name(slot)
    if server_version >= 150000:
        return f"CREATE_REPLICATION_SLOT {name} LOGICAL pgoutput (SNAPSHOT 'export')"
    return f"CREATE_REPLICATION_SLOT {name} LOGICAL pgoutput EXPORT_SNAPSHOT"


@contextlib.contextmanager
def create_slot_with_snapshot(url: str, slot: str, drop_on_error: bool = True) -> Iterator[SlotSnapshot]:
    """Create a pgoutput slot and yield its consistent LSN and exported snapshot.

    The snapshot stays importable (`use_snapshot`) until the block ends: the replication connection that
    exported it is held open and idle. Creating the slot waits for transactions running at that moment
    to finish. If the block raises, the slot is dropped (its position is useless without the copy),
    unless `drop_on_error` is False.
    """
    conn = replication_connection(url, HOLD_SECONDS)
    try:
        with conn.cursor() as cur:
            try:
                cur.execute(_create_command(slot, conn.server_version))
            except psycopg2.errors.DuplicateObject as exc:
                raise CdcError(
                    f"replication slot {slot!r} already exists; resume from its stored checkpoint, or drop it "
                    "(drop_slot) before taking a new snapshot"
                ) from exc
            except psycopg2.errors.ObjectNotInPrerequisiteState as exc:
                raise CdcError(f"cannot create replication slot {slot!r}: {str(exc).strip()}; run check_cdc") from exc
            _, lsn, snapshot_name, _ = cur.fetchone()
    except BaseException:
        conn.close()
        raise
    try:
        yield SlotSnapshot(slot=slot, consistent_lsn=parse_lsn(lsn), snapshot_name=snapshot_name)
    except BaseException:
        conn.close()
        if drop_on_error:
            drop_slot(url, slot)
        raise
    finally:
        conn.close()


def use_snapshot(cur: PgCursor, snapshot_name: str) -> None:
    """Start a read-only repeatable-read transaction on `cur`'s connection (autocommit on) that sees the
    exported snapshot; the caller ends it with COMMIT."""
    cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
