"""Streamed in-progress transactions (protocol v2+): held until they commit, aborted parts dropped."""

from __future__ import annotations

import time
from collections.abc import Callable

from ingestion_assets.sources.postgres.cdc import ReplicationStream, read_changes
from ingestion_assets.sources.postgres.cdc.messages import (
    Insert,
    Message,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
)
from ingestion_assets_tests.cdc.sandbox import SENTINEL, Sandbox, confirmed_flush, prepare

WORK_MEM_KB = 64  # the smallest logical_decoding_work_mem: a few thousand rows stream


def big_transactions(box: Sandbox, t: str) -> None:
    """A: 3000 rows, a rolled-back savepoint of 3000 more, one row; commits after C. B: rolled back whole
    (PostgreSQL 18 skips it without streaming when it decodes it after the rollback; 14-17 stream it)."""
    with box.connect(autocommit=False) as a, a.cursor() as cur:
        cur.execute(f"INSERT INTO {t} SELECT g, 'a' FROM generate_series(1, 3000) g")
        cur.execute("SAVEPOINT s1")
        cur.execute(f"INSERT INTO {t} SELECT g, 'gone' FROM generate_series(10001, 13000) g")
        cur.execute("ROLLBACK TO SAVEPOINT s1")
        box.execute(f"INSERT INTO {t} VALUES (50000, 'c')")  # C commits while A is open
        cur.execute(f"INSERT INTO {t} VALUES (20000, 'a-last')")
        a.commit()
    with box.connect(autocommit=False) as b, b.cursor() as cur:
        cur.execute(f"INSERT INTO {t} SELECT g, 'b' FROM generate_series(30001, 33000) g")
        b.rollback()


def test_streamed_transactions_commit_whole_without_their_aborted_parts(sandbox: Sandbox) -> None:
    t = prepare(sandbox)
    start = confirmed_flush(sandbox)
    big_transactions(sandbox, t)

    batch = read_changes(sandbox.url, sandbox.slot, sandbox.publication, start, streaming=True, work_mem_kb=WORK_MEM_KB)

    small, big = batch.transactions
    assert [c.new_record()["id"] for c in small.changes] == ["50000"] and not small.streamed
    assert big.streamed and small.commit_lsn < big.commit_lsn
    assert [c.new_record()["id"] for c in big.changes] == [str(i) for i in range(1, 3001)] + ["20000"]
    assert batch.end_lsn >= big.end_lsn
    plain = read_changes(sandbox.url, sandbox.slot, sandbox.publication, start)  # the same, not streamed
    assert [tx.changes for tx in plain.transactions] == [small.changes, big.changes]


def test_streaming_messages_decode(sandbox: Sandbox) -> None:
    """B is streamed while it runs, then rolled back: PostgreSQL 18 no longer streams transactions it already
    knows to be aborted, so B must still be open when the walsender decodes it."""
    t = prepare(sandbox)
    big_transactions(sandbox, t)
    with sandbox.connect(autocommit=False) as b, b.cursor() as cur:
        cur.execute(f"INSERT INTO {t} SELECT g, 'live' FROM generate_series(40001, 43000) g")
        cur.execute("SELECT pg_current_xact_id()::text::bigint % 4294967296")
        b_xid = cur.fetchone()[0]
        with ReplicationStream(
            sandbox.url, sandbox.slot, sandbox.publication, streaming=True, work_mem_kb=WORK_MEM_KB
        ) as stream:
            messages = until(stream, lambda m: isinstance(m, StreamStart) and m.xid == b_xid)
            b.rollback()
            sandbox.query("SELECT pg_logical_emit_message(false, %s, 'end')", (SENTINEL,))
            messages += until(stream, lambda m: isinstance(m, StreamAbort) and m.xid == b_xid)

    starts = [m for m in messages if isinstance(m, StreamStart)]
    assert starts[0].first_segment and len(starts) == sum(isinstance(m, StreamStop) for m in messages)
    aborts = [m for m in messages if isinstance(m, StreamAbort)]
    assert aborts[0].subxid != aborts[0].xid  # the savepoint of A
    assert aborts[-1].subxid == aborts[-1].xid == b_xid  # all of the live B (versions before 18 abort the first B too)
    assert all(m.abort_lsn is None for m in aborts)  # streaming = on, not parallel
    (commit,) = [m for m in messages if isinstance(m, StreamCommit)]
    assert commit.xid == starts[0].xid
    streamed = [m for m in messages if isinstance(m, Insert) and m.new[1] != "c"]
    assert all(m.xid is not None for m in streamed)  # changes inside a stream carry their (sub)transaction
    names = [m.new[1] for m in streamed]
    assert names.count("a") == 3000  # all of A; the aborted parts only as far as they were streamed
    assert 0 < names.count("gone") < 3000 and 0 < names.count("live") < 3000 and names.count("b") <= 3000


def until(stream: ReplicationStream, last: Callable[[Message], bool]) -> list[Message]:
    received: list[Message] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        item = stream.next(timeout=0.5)
        if item is not None:
            received.append(item[1])
            if last(item[1]):
                return received
    raise AssertionError(f"the expected message did not arrive after {len(received)} messages")
