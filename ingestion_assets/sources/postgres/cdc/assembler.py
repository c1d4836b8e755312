"""Group decoded pgoutput messages into whole transactions in commit order, streamed ones included."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from ingestion_assets.sources.postgres.cdc.changes import LogicalMessageInTx, Op, RowChange, TableInfo, Transaction
from ingestion_assets.sources.postgres.cdc.errors import CdcError, ProtocolError
from ingestion_assets.sources.postgres.cdc.messages import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Update,
)

RowData = Insert | Update | Delete | Truncate


@dataclass
class _Pending:
    """A transaction whose commit has not arrived yet: its changes wait for the commit LSN and time."""

    xid: int
    # (subtransaction xid, change, the tables it names as their Relation messages stood when it came: a
    # transaction that alters a table between two changes of it sends a new Relation between them)
    rows: list[tuple[int, RowData, tuple[TableInfo, ...]]] = field(default_factory=list)
    messages: list[LogicalMessageInTx] = field(default_factory=list)
    origin: str | None = None


class TransactionAssembler:
    """Feed it messages in stream order; `completed` holds whole transactions in commit order."""

    def __init__(self) -> None:
        self.tables: dict[int, TableInfo] = {}
        self.completed: list[Transaction] = []
        self.change_count = 0
        self._open: _Pending | None = None  # between Begin and Commit
        self._streamed: dict[int, _Pending] = {}  # streamed transactions by top-level xid
        self._stream_xid: int | None = None  # inside Stream Start .. Stream Stop

    @property
    def idle(self) -> bool:
        """No regular transaction is half received (streamed ones may be: their commit comes later)."""
        return self._open is None

    def feed(self, message: Message) -> None:
        if isinstance(message, Relation):
            self.tables[message.relation_id] = TableInfo.from_relation(message)
        elif isinstance(message, Insert | Update | Delete | Truncate):
            oids = message.relation_ids if isinstance(message, Truncate) else (message.relation_id,)
            tables = tuple(self._table(oid) for oid in oids)
            self._pending("a change").rows.append((message.xid or 0, message, tables))
        elif isinstance(message, LogicalMessage):
            if message.transactional:
                self._pending("a message").messages.append(
                    LogicalMessageInTx(message.prefix, message.content, message.lsn)
                )
        elif isinstance(message, Origin) and self._open is not None:
            self._open.origin = message.name
        elif isinstance(message, Begin | Commit):
            self._regular(message)
        elif isinstance(message, StreamStart | StreamStop | StreamCommit | StreamAbort):
            self._stream(message)
        elif isinstance(message, BeginPrepare | Prepare | CommitPrepared | RollbackPrepared):
            raise CdcError(
                "the slot sends two-phase (prepared) transactions, which this reader does not request; "
                "recreate the slot without two_phase"
            )

    def _pending(self, what: str) -> _Pending:
        if self._stream_xid is not None:
            return self._streamed.setdefault(self._stream_xid, _Pending(self._stream_xid))
        if self._open is None:
            raise ProtocolError(f"pgoutput sent {what} outside a transaction")
        return self._open

    def _regular(self, message: Begin | Commit) -> None:
        if isinstance(message, Begin):
            if self._open is not None:
                raise ProtocolError(f"Begin of xid {message.xid} before the Commit of xid {self._open.xid}")
            self._open = _Pending(message.xid)
            return
        if self._open is None:
            raise ProtocolError(f"Commit at {message.commit_lsn:X} without a Begin")
        pending, self._open = self._open, None
        self._complete(pending, message.commit_lsn, message.end_lsn, message.commit_time, streamed=False)

    def _stream(self, message: StreamStart | StreamStop | StreamCommit | StreamAbort) -> None:
        if isinstance(message, StreamStart):
            self._stream_xid = message.xid
        elif isinstance(message, StreamStop):
            self._stream_xid = None
        elif isinstance(message, StreamCommit):
            pending = self._streamed.pop(message.xid, _Pending(message.xid))
            self._complete(pending, message.commit_lsn, message.end_lsn, message.commit_time, streamed=True)
        elif message.subxid == message.xid:
            self._streamed.pop(message.xid, None)
        elif message.xid in self._streamed:
            self._abort_subtransaction(self._streamed[message.xid], message.subxid)

    @staticmethod
    def _abort_subtransaction(pending: _Pending, subxid: int) -> None:
        """Drop the subtransaction's changes and everything after its first one: the changes that follow
        an aborted subtransaction's first change until its abort belong to it or to its children."""
        for index, (owner, _, _) in enumerate(pending.rows):
            if owner == subxid:
                del pending.rows[index:]
                return

    def _complete(self, pending: _Pending, commit_lsn: int, end_lsn: int, time: dt.datetime, streamed: bool) -> None:
        changes: list[RowChange] = []
        for _, row, tables in pending.rows:
            changes.extend(self._row_changes(row, tables, pending.xid, commit_lsn, time, len(changes)))
        self.completed.append(
            Transaction(
                xid=pending.xid,
                commit_lsn=commit_lsn,
                end_lsn=end_lsn,
                commit_time=time,
                changes=tuple(changes),
                origin=pending.origin,
                messages=tuple(pending.messages),
                streamed=streamed,
            )
        )
        self.change_count += len(changes)

    def _row_changes(
        self, row: RowData, tables: tuple[TableInfo, ...], xid: int, lsn: int, time: dt.datetime, seq: int
    ) -> list[RowChange]:
        if isinstance(row, Truncate):
            return [
                RowChange(
                    Op.TRUNCATE,
                    table,
                    None,
                    None,
                    None,
                    xid,
                    lsn,
                    time,
                    seq + i,
                    row.cascade,
                    row.restart_identity,
                )
                for i, table in enumerate(tables)
            ]
        (table,) = tables
        if isinstance(row, Insert):
            return [RowChange(Op.INSERT, table, self._checked(table, row.new), None, None, xid, lsn, time, seq)]
        if isinstance(row, Update):
            old = None if row.old is None else self._checked(table, row.old)
            new = self._checked(table, row.new)
            return [RowChange(Op.UPDATE, table, new, old, row.old_kind, xid, lsn, time, seq)]
        old = self._checked(table, row.old)
        return [RowChange(Op.DELETE, table, None, old, row.old_kind, xid, lsn, time, seq)]

    def _table(self, relation_id: int) -> TableInfo:
        table = self.tables.get(relation_id)
        if table is None:
            raise ProtocolError(f"pgoutput sent a change of relation {relation_id} before its Relation message")
        return table

    @staticmethod
    def _checked(table: TableInfo, values: TupleData) -> TupleData:
        if len(values) != len(table.columns):
            raise ProtocolError(
                f"a row of {table.schema}.{table.table} has {len(values)} values for {len(table.columns)} columns"
            )
        return values
