"""PostgreSQL change data capture: pgoutput decoding, reading a slot in whole transactions, snapshots, slot health.

The contract: read a batch, load it, store `batch.end_lsn` as the checkpoint, then `acknowledge` it.
Nothing here acknowledges on its own, so a crash anywhere re-reads from the stored checkpoint.
"""

from __future__ import annotations

from ingestion_assets.sources.postgres.cdc.admin import check_cdc
from ingestion_assets.sources.postgres.cdc.changes import ChangeBatch, Op, RowChange, TableInfo, Transaction
from ingestion_assets.sources.postgres.cdc.errors import (
    AcknowledgeTimeout,
    CdcError,
    Problem,
    ProtocolError,
    SlotInUseError,
    SlotMissingError,
)
from ingestion_assets.sources.postgres.cdc.keys import DeclaredKey
from ingestion_assets.sources.postgres.cdc.lsn import format_lsn, parse_lsn, to_lsn
from ingestion_assets.sources.postgres.cdc.messages import UNCHANGED_TOAST, Value
from ingestion_assets.sources.postgres.cdc.pgoutput import Decoder, decode
from ingestion_assets.sources.postgres.cdc.publication import TableName, drop_unread_tables, ensure_publication
from ingestion_assets.sources.postgres.cdc.reader import acknowledge, read_changes
from ingestion_assets.sources.postgres.cdc.replication import ReplicationStream, protocol_version
from ingestion_assets.sources.postgres.cdc.slots import SlotHealth, WalGap, drop_slot, find_gap, slot_health
from ingestion_assets.sources.postgres.cdc.snapshot import SlotSnapshot, create_slot_with_snapshot, use_snapshot

__all__ = [
    "UNCHANGED_TOAST",
    "AcknowledgeTimeout",
    "CdcError",
    "ChangeBatch",
    "DeclaredKey",
    "Decoder",
    "Op",
    "Problem",
    "ProtocolError",
    "ReplicationStream",
    "RowChange",
    "SlotHealth",
    "SlotInUseError",
    "SlotMissingError",
    "SlotSnapshot",
    "TableInfo",
    "TableName",
    "Transaction",
    "Value",
    "WalGap",
    "acknowledge",
    "check_cdc",
    "create_slot_with_snapshot",
    "decode",
    "drop_slot",
    "drop_unread_tables",
    "ensure_publication",
    "find_gap",
    "format_lsn",
    "parse_lsn",
    "protocol_version",
    "read_changes",
    "slot_health",
    "to_lsn",
    "use_snapshot",
]
