"""Row changes as the reader hands them out: whole transactions in commit order, values as PostgreSQL text."""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass

from ingestion_assets.sources.postgres.cdc.messages import OldKind, Relation, TupleData, Value


class Op(enum.StrEnum):
    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"
    TRUNCATE = "truncate"


@dataclass(frozen=True)
class TableInfo:
    """A table as the last Relation message described it; columns exclude dropped and generated ones."""

    relation_id: int
    schema: str
    table: str
    columns: tuple[str, ...]
    type_oids: tuple[int, ...]
    key_columns: tuple[str, ...]  # the replica identity: primary key, identity index, or every column (FULL)
    replica_identity: str  # 'd' default, 'n' nothing, 'f' full, 'i' index

    @classmethod
    def from_relation(cls, relation: Relation) -> TableInfo:
        return cls(
            relation_id=relation.relation_id,
            schema=relation.namespace or "pg_catalog",
            table=relation.name,
            columns=tuple(c.name for c in relation.columns),
            type_oids=tuple(c.type_oid for c in relation.columns),
            key_columns=tuple(c.name for c in relation.columns if c.is_key),
            replica_identity=relation.replica_identity,
        )


@dataclass(frozen=True)
class RowChange:
    """One row change. Values are PostgreSQL's text output (str), None for NULL, or UNCHANGED_TOAST.

    `new` is the whole new row for insert and update. `old` is, for update and delete, the key columns
    (other columns None) with `old_kind` "key", or the whole old row with "full" (REPLICA IDENTITY FULL);
    an update that kept its key under a key identity has no `old`. Truncate has neither.
    The version of a row is (commit_lsn, seq): later changes of a row always compare greater.
    """

    op: Op
    table: TableInfo
    new: TupleData | None
    old: TupleData | None
    old_kind: OldKind | None
    xid: int
    commit_lsn: int
    commit_time: dt.datetime
    seq: int  # position within the transaction, from 0
    cascade: bool = False  # truncate only
    restart_identity: bool = False  # truncate only

    def new_record(self) -> dict[str, Value]:
        """The new row by column name (empty for delete and truncate)."""
        return dict(zip(self.table.columns, self.new or (), strict=False))

    def key(self) -> tuple[Value, ...]:
        """The replica identity key of the row as it was before this change (after it, for insert)."""
        row = self.old if self.old is not None else self.new
        if row is None:
            return ()
        by_name = dict(zip(self.table.columns, row, strict=True))
        return tuple(by_name[c] for c in self.table.key_columns)


@dataclass(frozen=True)
class LogicalMessageInTx:
    """A transactional pg_logical_emit_message() inside a transaction (requested with messages=True)."""

    prefix: str
    content: bytes
    lsn: int


@dataclass(frozen=True)
class Transaction:
    xid: int
    commit_lsn: int  # start of the commit record
    end_lsn: int  # end of the commit record: acknowledge this to never see the transaction again
    commit_time: dt.datetime
    changes: tuple[RowChange, ...]
    origin: str | None = None
    messages: tuple[LogicalMessageInTx, ...] = ()
    streamed: bool = False


@dataclass(frozen=True)
class ChangeBatch:
    """Whole transactions in commit order, and the position to store as the checkpoint once they are loaded.

    `end_lsn` is the end of the last transaction's commit record, or further when the reader caught up
    with nothing left in flight: every transaction committing before it is in this or an earlier batch.
    Storing it and then acknowledging it never skips a change.
    """

    start_lsn: int
    end_lsn: int
    transactions: tuple[Transaction, ...]
    caught_up: bool  # the reader reached the server's WAL position of when the read started

    @property
    def changes(self) -> list[RowChange]:
        return [change for tx in self.transactions for change in tx.changes]

    def __len__(self) -> int:
        return sum(len(tx.changes) for tx in self.transactions)
