"""Decode pgoutput logical replication messages (protocol versions 1-4) from their bytes.

Any input that is not a valid message raises ProtocolError naming the message type and the offset;
no other exception escapes (the decoder is fuzzed).
"""

from __future__ import annotations

from collections.abc import Callable

from ingestion_assets.sources.postgres.cdc.errors import ProtocolError
from ingestion_assets.sources.postgres.cdc.messages import (
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    OldKind,
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
    TypeInfo,
    Update,
)
from ingestion_assets.sources.postgres.cdc.wire import OLD_KINDS, FieldReader


def _begin(c: FieldReader, in_stream: bool) -> Message:
    return Begin(c.u64("final LSN"), c.timestamp("commit time"), c.u32("xid"))


def _commit(c: FieldReader, in_stream: bool) -> Message:
    return Commit(c.u8("flags"), c.u64("commit LSN"), c.u64("end LSN"), c.timestamp("commit time"))


def _origin(c: FieldReader, in_stream: bool) -> Message:
    return Origin(c.u64("origin commit LSN"), c.string("origin name"))


def _relation(c: FieldReader, in_stream: bool) -> Message:
    xid, oid, namespace, name = c.xid_if(in_stream), c.u32("relation id"), c.string("namespace"), c.string("name")
    identity = chr(c.u8("replica identity"))
    count = c.i16("column count")
    if count < 0:
        raise c.fail(f"negative column count {count}", c.offset - 2)
    columns = tuple(
        Column(c.u8("column flags"), c.string("column name"), c.u32("type oid"), c.i32("type modifier"))
        for _ in range(count)
    )
    return Relation(xid, oid, namespace, name, identity, columns)


def _type(c: FieldReader, in_stream: bool) -> Message:
    return TypeInfo(c.xid_if(in_stream), c.u32("type oid"), c.string("namespace"), c.string("type name"))


def _insert(c: FieldReader, in_stream: bool) -> Message:
    xid, oid = c.xid_if(in_stream), c.u32("relation id")
    c.expect("N")
    return Insert(xid, oid, c.tuple_data())


def _update(c: FieldReader, in_stream: bool) -> Message:
    xid, oid = c.xid_if(in_stream), c.u32("relation id")
    old_kind: OldKind | None = None
    old: TupleData | None = None
    if c.offset < len(c.data) and c.data[c.offset] in OLD_KINDS:
        old_kind, old = c.old_tuple()
    c.expect("N")
    return Update(xid, oid, old_kind, old, c.tuple_data())


def _delete(c: FieldReader, in_stream: bool) -> Message:
    xid, oid = c.xid_if(in_stream), c.u32("relation id")
    old_kind, old = c.old_tuple()
    return Delete(xid, oid, old_kind, old)


def _truncate(c: FieldReader, in_stream: bool) -> Message:
    xid, count, options = c.xid_if(in_stream), c.u32("relation count"), c.u8("options")
    if count * 4 > len(c.data) - c.offset:
        raise c.fail(f"truncated list of {count} relation ids")
    return Truncate(xid, options, tuple(c.u32("relation id") for _ in range(count)))


def _message(c: FieldReader, in_stream: bool) -> Message:
    xid, flags, lsn, prefix = c.xid_if(in_stream), c.u8("flags"), c.u64("message LSN"), c.string("prefix")
    content = c.raw(c.i32("content length"), "content")
    return LogicalMessage(xid, bool(flags & 1), lsn, prefix, content)


def _stream_start(c: FieldReader, in_stream: bool) -> Message:
    return StreamStart(c.u32("xid"), c.u8("first segment flag") == 1)


def _stream_stop(c: FieldReader, in_stream: bool) -> Message:
    return StreamStop()


def _stream_commit(c: FieldReader, in_stream: bool) -> Message:
    return StreamCommit(c.u32("xid"), c.u8("flags"), c.u64("commit LSN"), c.u64("end LSN"), c.timestamp("commit time"))


def _stream_abort(c: FieldReader, in_stream: bool) -> Message:
    xid, subxid = c.u32("xid"), c.u32("subtransaction xid")
    if c.offset == len(c.data):
        return StreamAbort(xid, subxid)
    return StreamAbort(xid, subxid, c.u64("abort LSN"), c.timestamp("abort time"))  # v4, streaming = parallel


def _begin_prepare(c: FieldReader, in_stream: bool) -> Message:
    return BeginPrepare(
        c.u64("prepare LSN"), c.u64("end LSN"), c.timestamp("prepare time"), c.u32("xid"), c.string("gid")
    )


def _prepare(c: FieldReader, in_stream: bool, streamed: bool = False) -> Message:
    return Prepare(
        c.u8("flags"),
        c.u64("prepare LSN"),
        c.u64("end LSN"),
        c.timestamp("prepare time"),
        c.u32("xid"),
        c.string("gid"),
        streamed,
    )


def _stream_prepare(c: FieldReader, in_stream: bool) -> Message:
    return _prepare(c, in_stream, streamed=True)


def _commit_prepared(c: FieldReader, in_stream: bool) -> Message:
    return CommitPrepared(
        c.u8("flags"), c.u64("commit LSN"), c.u64("end LSN"), c.timestamp("commit time"), c.u32("xid"), c.string("gid")
    )


def _rollback_prepared(c: FieldReader, in_stream: bool) -> Message:
    return RollbackPrepared(
        c.u8("flags"),
        c.u64("prepare end LSN"),
        c.u64("rollback end LSN"),
        c.timestamp("prepare time"),
        c.timestamp("rollback time"),
        c.u32("xid"),
        c.string("gid"),
    )


_DECODERS: dict[int, Callable[[FieldReader, bool], Message]] = {
    ord(kind): fn
    for kind, fn in {
        "B": _begin,
        "C": _commit,
        "O": _origin,
        "R": _relation,
        "Y": _type,
        "I": _insert,
        "U": _update,
        "D": _delete,
        "T": _truncate,
        "M": _message,
        "S": _stream_start,
        "E": _stream_stop,
        "c": _stream_commit,
        "A": _stream_abort,
        "b": _begin_prepare,
        "P": _prepare,
        "K": _commit_prepared,
        "r": _rollback_prepared,
        "p": _stream_prepare,
    }.items()
}


def decode(payload: bytes, in_stream: bool = False) -> Message:
    """One message; `in_stream` says it arrived between Stream Start and Stream Stop (so it carries an xid)."""
    if not payload:
        raise ProtocolError("empty pgoutput message; the replication stream is corrupt")
    decoder = _DECODERS.get(payload[0])
    cursor = FieldReader(bytes(payload), payload[0])
    if decoder is None:
        raise cursor.fail("unknown message type", 0)
    return cursor.finish(decoder(cursor, in_stream))


class Decoder:
    """Decodes a stream of messages, tracking whether it is inside a streamed transaction."""

    def __init__(self) -> None:
        self.in_stream = False

    def decode(self, payload: bytes) -> Message:
        message = decode(payload, self.in_stream)
        if isinstance(message, StreamStart):
            if self.in_stream:
                raise ProtocolError(f"Stream Start for xid {message.xid} inside another streamed block")
            self.in_stream = True
        elif isinstance(message, StreamStop):
            if not self.in_stream:
                raise ProtocolError("Stream Stop outside a streamed block")
            self.in_stream = False
        return message
