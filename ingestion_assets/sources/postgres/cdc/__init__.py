"""PostgreSQL change data capture: pgoutput decoding, reading a slot in whole transactions, snapshots, slot health.

The contract: read a batch, load it, store `batch.end_lsn` as the checkpoint, then `acknowledge` it.
Nothing here acknowledges on its own, so a crash anywhere re-reads from the stored checkpoint.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# Each name's module, imported on first use: a polled stream's run needs `keys` only, not the decoder (~40 ms)
_WHERE = {
    "AcknowledgeTimeout": "errors",
    "CdcError": "errors",
    "ChangeBatch": "changes",
    "DeclaredKey": "keys",
    "Decoder": "pgoutput",
    "Op": "changes",
    "Problem": "errors",
    "ProtocolError": "errors",
    "ReplicationStream": "replication",
    "RowChange": "changes",
    "SlotHealth": "slots",
    "SlotInUseError": "errors",
    "SlotMissingError": "errors",
    "SlotSnapshot": "snapshot",
    "TableInfo": "changes",
    "TableName": "publication",
    "Transaction": "changes",
    "UNCHANGED_TOAST": "messages",
    "Value": "messages",
    "WalGap": "slots",
    "acknowledge": "reader",
    "check_cdc": "admin",
    "create_slot_with_snapshot": "snapshot",
    "decode": "pgoutput",
    "drop_slot": "slots",
    "drop_unread_tables": "publication",
    "ensure_publication": "publication",
    "find_gap": "slots",
    "format_lsn": "lsn",
    "parse_lsn": "lsn",
    "protocol_version": "replication",
    "read_changes": "reader",
    "slot_health": "slots",
    "to_lsn": "lsn",
    "use_snapshot": "snapshot",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


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
