"""A test-only pgoutput encoder, the mirror of the decoder, and hypothesis strategies for every message."""

from __future__ import annotations

import datetime as dt
import struct

from hypothesis import strategies as st

from ingestion_assets.sources.postgres.cdc.messages import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Column,
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
    TypeInfo,
    Update,
)
from ingestion_assets.sources.postgres.cdc.wire import PG_EPOCH


def u8(v: int) -> bytes:
    return struct.pack(">B", v)


def u32(v: int) -> bytes:
    return struct.pack(">I", v)


def u64(v: int) -> bytes:
    return struct.pack(">Q", v)


def ts(v: dt.datetime) -> bytes:
    delta = v - PG_EPOCH
    return struct.pack(">q", (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)


def string(v: str) -> bytes:
    return v.encode() + b"\0"


def xid(v: int | None) -> bytes:
    return b"" if v is None else u32(v)


def tuple_data(values: TupleData) -> bytes:
    out = struct.pack(">h", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value is UNCHANGED_TOAST:
            out += b"u"
        elif isinstance(value, str):
            out += b"t" + struct.pack(">i", len(value.encode())) + value.encode()
        else:
            assert isinstance(value, bytes)
            out += b"b" + struct.pack(">i", len(value)) + value
    return out


def old(kind: str | None, values: TupleData | None) -> bytes:
    return b"" if kind is None or values is None else (b"K" if kind == "key" else b"O") + tuple_data(values)


def encode(m: Message) -> bytes:
    if isinstance(m, Begin):
        return b"B" + u64(m.final_lsn) + ts(m.commit_time) + u32(m.xid)
    if isinstance(m, Commit):
        return b"C" + u8(m.flags) + u64(m.commit_lsn) + u64(m.end_lsn) + ts(m.commit_time)
    if isinstance(m, Origin):
        return b"O" + u64(m.commit_lsn) + string(m.name)
    if isinstance(m, Relation):
        columns = b"".join(
            u8(c.flags) + string(c.name) + u32(c.type_oid) + struct.pack(">i", c.type_modifier) for c in m.columns
        )
        head = b"R" + xid(m.xid) + u32(m.relation_id) + string(m.namespace) + string(m.name)
        return head + m.replica_identity.encode("latin-1") + struct.pack(">h", len(m.columns)) + columns
    if isinstance(m, TypeInfo):
        return b"Y" + xid(m.xid) + u32(m.type_oid) + string(m.namespace) + string(m.name)
    if isinstance(m, Insert):
        return b"I" + xid(m.xid) + u32(m.relation_id) + b"N" + tuple_data(m.new)
    if isinstance(m, Update):
        return b"U" + xid(m.xid) + u32(m.relation_id) + old(m.old_kind, m.old) + b"N" + tuple_data(m.new)
    if isinstance(m, Delete):
        return b"D" + xid(m.xid) + u32(m.relation_id) + old(m.old_kind, m.old)
    if isinstance(m, Truncate):
        return b"T" + xid(m.xid) + u32(len(m.relation_ids)) + u8(m.options) + b"".join(map(u32, m.relation_ids))
    if isinstance(m, LogicalMessage):
        body = u8(int(m.transactional)) + u64(m.lsn) + string(m.prefix) + struct.pack(">i", len(m.content))
        return b"M" + xid(m.xid) + body + m.content
    if isinstance(m, StreamStart):
        return b"S" + u32(m.xid) + u8(int(m.first_segment))
    if isinstance(m, StreamStop):
        return b"E"
    if isinstance(m, StreamCommit):
        return b"c" + u32(m.xid) + u8(m.flags) + u64(m.commit_lsn) + u64(m.end_lsn) + ts(m.commit_time)
    if isinstance(m, StreamAbort):
        parallel = b"" if m.abort_lsn is None or m.abort_time is None else u64(m.abort_lsn) + ts(m.abort_time)
        return b"A" + u32(m.xid) + u32(m.subxid) + parallel
    if isinstance(m, BeginPrepare):
        return b"b" + u64(m.prepare_lsn) + u64(m.end_lsn) + ts(m.prepare_time) + u32(m.xid) + string(m.gid)
    if isinstance(m, Prepare):
        body = u8(m.flags) + u64(m.prepare_lsn) + u64(m.end_lsn) + ts(m.prepare_time) + u32(m.xid) + string(m.gid)
        return (b"p" if m.streamed else b"P") + body
    if isinstance(m, CommitPrepared):
        return b"K" + u8(m.flags) + u64(m.commit_lsn) + u64(m.end_lsn) + ts(m.commit_time) + u32(m.xid) + string(m.gid)
    assert isinstance(m, RollbackPrepared)
    times = ts(m.prepare_time) + ts(m.rollback_time)
    return b"r" + u8(m.flags) + u64(m.prepare_end_lsn) + u64(m.rollback_end_lsn) + times + u32(m.xid) + string(m.gid)


U8, U32, U64 = st.integers(0, 255), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)
TIMES = st.datetimes(timezones=st.just(dt.UTC))
NAMES = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=12)
VALUES = st.one_of(
    st.none(), st.just(UNCHANGED_TOAST), st.text(st.characters(codec="utf-8"), max_size=20), st.binary(max_size=20)
)
TUPLES = st.lists(VALUES, max_size=6).map(tuple)


def messages(in_stream: bool) -> st.SearchStrategy[Message]:
    """Every message kind; the ones that carry an xid in a stream get one exactly when `in_stream`."""
    x = U32 if in_stream else st.none()
    columns = st.lists(st.builds(Column, U8, NAMES, U32, st.integers(-(2**31), 2**31 - 1)), max_size=5)
    old_pair = st.one_of(st.tuples(st.none(), st.none()), st.tuples(st.sampled_from(["key", "full"]), TUPLES))
    return st.one_of(
        st.builds(Begin, U64, TIMES, U32),
        st.builds(Commit, U8, U64, U64, TIMES),
        st.builds(Origin, U64, NAMES),
        st.builds(Relation, x, U32, NAMES, NAMES, st.sampled_from("dnfi"), columns.map(tuple)),
        st.builds(TypeInfo, x, U32, NAMES, NAMES),
        st.builds(Insert, x, U32, TUPLES),
        st.builds(lambda x_, oid, pair, new: Update(x_, oid, pair[0], pair[1], new), x, U32, old_pair, TUPLES),
        st.builds(Delete, x, U32, st.sampled_from(["key", "full"]), TUPLES),
        st.builds(Truncate, x, U8, st.lists(U32, max_size=4).map(tuple)),
        st.builds(LogicalMessage, x, st.booleans(), U64, NAMES, st.binary(max_size=30)),
        st.builds(StreamStart, U32, st.booleans()),
        st.just(StreamStop()),
        st.builds(StreamCommit, U32, U8, U64, U64, TIMES),
        st.builds(StreamAbort, U32, U32),
        st.builds(StreamAbort, U32, U32, U64, TIMES),
        st.builds(BeginPrepare, U64, U64, TIMES, U32, NAMES),
        st.builds(Prepare, U8, U64, U64, TIMES, U32, NAMES, st.booleans()),
        st.builds(CommitPrepared, U8, U64, U64, TIMES, U32, NAMES),
        st.builds(RollbackPrepared, U8, U64, U64, TIMES, TIMES, U32, NAMES),
    )
