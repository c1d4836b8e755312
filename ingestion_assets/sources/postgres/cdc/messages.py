"""The messages of the pgoutput logical replication protocol (versions 1-4), as frozen dataclasses.

Field names follow PostgreSQL's "Logical Replication Message Formats". `xid` is None unless the message
arrived inside a streamed transaction (protocol v2+), where change messages carry the (sub)transaction id.
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass
from typing import Literal


class Unchanged(enum.Enum):
    """A TOASTed value the UPDATE did not change: the server does not send it again."""

    TOAST = "unchanged-toast"

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST = Unchanged.TOAST
Value = str | bytes | None | Literal[Unchanged.TOAST]  # text 't', binary 'b', null 'n', unchanged 'u'
TupleData = tuple[Value, ...]
OldKind = Literal["key", "full"]  # 'K': replica identity key columns only; 'O': the whole old row


@dataclass(frozen=True)
class Begin:
    final_lsn: int  # LSN of the commit record
    commit_time: dt.datetime
    xid: int


@dataclass(frozen=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int  # end of the commit record: the position to resume from after this transaction
    commit_time: dt.datetime


@dataclass(frozen=True)
class Origin:
    commit_lsn: int
    name: str


@dataclass(frozen=True)
class Column:
    flags: int
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & 1)


@dataclass(frozen=True)
class Relation:
    xid: int | None
    relation_id: int
    namespace: str
    name: str
    replica_identity: str  # 'd' default (primary key), 'n' nothing, 'f' full, 'i' index
    columns: tuple[Column, ...]


@dataclass(frozen=True)
class TypeInfo:
    xid: int | None
    type_oid: int
    namespace: str
    name: str


@dataclass(frozen=True)
class Insert:
    xid: int | None
    relation_id: int
    new: TupleData


@dataclass(frozen=True)
class Update:
    xid: int | None
    relation_id: int
    old_kind: OldKind | None  # None: the key did not change and the identity is not FULL
    old: TupleData | None
    new: TupleData


@dataclass(frozen=True)
class Delete:
    xid: int | None
    relation_id: int
    old_kind: OldKind
    old: TupleData


@dataclass(frozen=True)
class Truncate:
    xid: int | None
    options: int
    relation_ids: tuple[int, ...]

    @property
    def cascade(self) -> bool:
        return bool(self.options & 1)

    @property
    def restart_identity(self) -> bool:
        return bool(self.options & 2)


@dataclass(frozen=True)
class LogicalMessage:
    xid: int | None
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True)
class StreamStop:
    pass


@dataclass(frozen=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: dt.datetime


@dataclass(frozen=True)
class StreamAbort:
    xid: int
    subxid: int  # equal to xid when the whole transaction aborted
    abort_lsn: int | None = None  # v4 with streaming = parallel only
    abort_time: dt.datetime | None = None


@dataclass(frozen=True)
class BeginPrepare:
    prepare_lsn: int
    end_lsn: int
    prepare_time: dt.datetime
    xid: int
    gid: str


@dataclass(frozen=True)
class Prepare:
    """'P' (Prepare) and, with `streamed`, 'p' (Stream Prepare): the same fields."""

    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time: dt.datetime
    xid: int
    gid: str
    streamed: bool = False


@dataclass(frozen=True)
class CommitPrepared:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: dt.datetime
    xid: int
    gid: str


@dataclass(frozen=True)
class RollbackPrepared:
    flags: int
    prepare_end_lsn: int
    rollback_end_lsn: int
    prepare_time: dt.datetime
    rollback_time: dt.datetime
    xid: int
    gid: str


Message = (
    Begin
    | Commit
    | Origin
    | Relation
    | TypeInfo
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | BeginPrepare
    | Prepare
    | CommitPrepared
    | RollbackPrepared
)
