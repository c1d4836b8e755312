"""Reading a slot: whole transactions in commit order, bounded batches, and acknowledgement only on request."""

from __future__ import annotations

import random
import select
import threading
import time

import psycopg2
import psycopg2.extras
import pytest

from ingestion_assets.sources.postgres.cdc import (
    UNCHANGED_TOAST,
    Op,
    acknowledge,
    read_changes,
    slot_health,
)
from ingestion_assets.sources.postgres.cdc.errors import DecodeTimeout
from ingestion_assets_tests.cdc.sandbox import COLUMNS, Replica, Sandbox, confirmed_flush, prepare, read_all


def write_transactions(box: Sandbox, writer: int, count: int, sizes: dict[int, int]) -> None:
    """`count` transactions of 1-4 inserts and updates; records each transaction's change count by xid."""
    rng = random.Random(writer)
    t = box.qualified("t")
    with box.connect(autocommit=False) as conn, conn.cursor() as cur:
        for i in range(count):
            rows = rng.randint(1, 4)
            for j in range(rows):
                key = writer * 100_000 + i * 10 + j
                cur.execute(f"INSERT INTO {t} VALUES (%s, %s, NULL, %s)", (key, f"w{writer}", i))
            cur.execute(f"UPDATE {t} SET n = n + 1 WHERE id = %s", (writer * 100_000 + i * 10,))
            cur.execute("SELECT pg_current_xact_id()::text::bigint % 4294967296")
            sizes[cur.fetchone()[0]] = rows + 1
            conn.commit()


def test_concurrent_writers_arrive_as_whole_transactions_in_commit_order(sandbox: Sandbox) -> None:
    t = prepare(sandbox)
    start = confirmed_flush(sandbox)
    sizes: dict[int, int] = {}
    writers = [threading.Thread(target=write_transactions, args=(sandbox, w, 40, sizes)) for w in range(1, 4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()

    batches = read_all(sandbox, start, max_changes=7, max_seconds=10)

    transactions = [tx for batch in batches for tx in batch.transactions]
    assert {tx.xid: len(tx.changes) for tx in transactions} == sizes  # every transaction, whole, once
    assert [tx.commit_lsn for tx in transactions] == sorted(tx.commit_lsn for tx in transactions)
    for batch in batches[:-1]:
        assert len(batch) >= 7 and len(batch) - len(batch.transactions[-1].changes) < 7
        assert batch.end_lsn == batch.transactions[-1].end_lsn
    for tx in transactions:
        assert [c.seq for c in tx.changes] == list(range(len(tx.changes)))
        assert {(c.commit_lsn, c.xid, c.commit_time) for c in tx.changes} == {(tx.commit_lsn, tx.xid, tx.commit_time)}
    replica = Replica()
    replica.apply(c for batch in batches for c in batch.changes)
    assert replica.without_key() == sandbox.text_rows("t", COLUMNS)
    assert sandbox.query(f"SELECT count(*) FROM {t}")[0][0] == len(replica.rows) > 0


def test_a_transaction_bigger_than_the_batch_comes_whole(sandbox: Sandbox) -> None:
    t = prepare(sandbox)
    start = confirmed_flush(sandbox)
    sandbox.execute(f"INSERT INTO {t} SELECT g, 'bulk' FROM generate_series(1, 50) g")
    sandbox.execute(f"INSERT INTO {t} VALUES (51, 'after')")
    batch = read_changes(sandbox.url, sandbox.slot, sandbox.publication, start, max_changes=10)
    assert [len(tx.changes) for tx in batch.transactions] == [50]
    assert not batch.caught_up and batch.end_lsn == batch.transactions[0].end_lsn
    rest = read_changes(sandbox.url, sandbox.slot, sandbox.publication, batch.end_lsn, max_changes=10)
    assert [c.new_record()["name"] for c in rest.changes] == ["after"] and rest.caught_up


def test_unchanged_toast_nulls_key_changes_and_truncate_replay_exactly(sandbox: Sandbox) -> None:
    t = prepare(sandbox)
    start = confirmed_flush(sandbox)
    big = "".join(random.Random(7).choice("abcdef") for _ in range(300_000))
    sandbox.execute(f"INSERT INTO {t} VALUES (1, 'a', %s, 1.5), (2, NULL, NULL, NULL), (3, 'c', 'x', 3)", params=(big,))
    sandbox.execute(f"UPDATE {t} SET name = 'b', n = NULL WHERE id = 1")
    sandbox.execute(f"UPDATE {t} SET id = 20, name = 'moved' WHERE id = 2")
    sandbox.execute(f"DELETE FROM {t} WHERE id = 3")
    batch = read_changes(sandbox.url, sandbox.slot, sandbox.publication, start)
    update = batch.changes[3]
    assert update.op is Op.UPDATE and update.new == ("1", "b", UNCHANGED_TOAST, None) and update.old is None
    moved = batch.changes[4]
    assert moved.key() == ("2",) and moved.old_kind == "key" and moved.new_record()["id"] == "20"
    replica = Replica()
    replica.apply(batch.changes)
    assert replica.without_key() == sandbox.text_rows("t", COLUMNS)
    assert replica.rows["1"][2] == big

    sandbox.execute(f"TRUNCATE {t}")
    truncated = read_changes(sandbox.url, sandbox.slot, sandbox.publication, batch.end_lsn)
    assert [(c.op, c.table.table, c.cascade) for c in truncated.changes] == [(Op.TRUNCATE, "t", False)]


def test_nothing_is_acknowledged_until_asked(sandbox: Sandbox) -> None:
    t = prepare(sandbox, "CREATE TABLE {}.other (id int)".format(f'"{sandbox.schema}"'))
    before = confirmed_flush(sandbox)
    for i in range(3):
        sandbox.execute(f"INSERT INTO {t} VALUES ({i}, 'v')")

    first = read_changes(sandbox.url, sandbox.slot, sandbox.publication, None)
    again = read_changes(sandbox.url, sandbox.slot, sandbox.publication, None)  # reconnect, no acknowledgement
    assert len(first.transactions) == 3 and again.transactions == first.transactions
    assert confirmed_flush(sandbox) == before

    sandbox.execute(f'INSERT INTO "{sandbox.schema}".other SELECT generate_series(1, 1000)')  # WAL, not published
    idle = read_changes(
        sandbox.url, sandbox.slot, sandbox.publication, first.end_lsn, until_caught_up=False, max_seconds=2
    )
    assert idle.transactions == () and idle.end_lsn > first.end_lsn  # caught up past unpublished WAL
    assert confirmed_flush(sandbox) == before  # keepalives did not move the slot

    acknowledge(sandbox.url, sandbox.slot, sandbox.publication, first.end_lsn)
    assert confirmed_flush(sandbox) == first.end_lsn  # exactly what was acknowledged, not the WAL end
    after = read_changes(sandbox.url, sandbox.slot, sandbox.publication, None)
    assert after.transactions == ()
    acknowledge(sandbox.url, sandbox.slot, sandbox.publication, before)  # behind the slot: left alone
    assert confirmed_flush(sandbox) == first.end_lsn
    acknowledge(sandbox.url, sandbox.slot, sandbox.publication, idle.end_lsn)
    assert slot_health(sandbox.url, sandbox.slot).confirmed_flush_lsn == idle.end_lsn


def test_a_time_limited_read_returns_what_committed_in_time(sandbox: Sandbox) -> None:
    t = prepare(sandbox)
    start = confirmed_flush(sandbox)

    def late_writer() -> None:
        time.sleep(0.5)
        sandbox.execute(f"INSERT INTO {t} VALUES (1, 'late')")

    writer = threading.Thread(target=late_writer)
    writer.start()
    began = time.monotonic()
    batch = read_changes(sandbox.url, sandbox.slot, sandbox.publication, start, until_caught_up=False, max_seconds=1.5)
    writer.join()
    assert time.monotonic() - began >= 1.5
    assert [c.new_record()["name"] for c in batch.changes] == ["late"]


@pytest.mark.parametrize("bad", [dict(max_changes=0), dict(max_seconds=0)])
def test_limits_must_be_positive(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        read_changes("postgresql://unused", "slot", "pub", 0, **bad)  # type: ignore[arg-type]


def test_psycopg2_alone_would_acknowledge_on_idle_keepalives(sandbox: Sandbox) -> None:
    """The hazard ReplicationStream avoids: a plain psycopg2 reader that has received no data moves its flush
    position to the WAL end of a keepalive, and its periodic status update confirms that to the slot."""
    prepare(sandbox)
    before = confirmed_flush(sandbox)
    sandbox.execute(f'CREATE TABLE "{sandbox.schema}".other AS SELECT generate_series(1, 1000) AS id')  # WAL
    conn = psycopg2.connect(sandbox.url, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        cur = conn.cursor()
        options = {"proto_version": "1", "publication_names": sandbox.publication}
        cur.start_replication(slot_name=sandbox.slot, decode=False, options=options, status_interval=1)
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            assert cur.read_message() is None
            select.select([cur], [], [], 0.2)
    finally:
        conn.close()
    assert confirmed_flush(sandbox) > before


def test_a_transaction_that_decodes_longer_than_the_read_still_arrives(sandbox: Sandbox) -> None:
    """Stopping at max_seconds with nothing received would decode the same WAL in every run, for ever."""
    t = prepare(sandbox)
    start = confirmed_flush(sandbox)
    sandbox.execute(f"INSERT INTO {t} SELECT g, 'bulk' FROM generate_series(1, 30000) g")
    batch = read_changes(sandbox.url, sandbox.slot, sandbox.publication, start, max_seconds=0.001)
    assert [len(tx.changes) for tx in batch.transactions] == [30_000]
    assert sorted(int(c.new_record()["id"]) for c in batch.changes) == list(range(1, 30_001))
    idle = read_changes(sandbox.url, sandbox.slot, sandbox.publication, batch.end_lsn, max_seconds=0.001)
    assert not idle.transactions and idle.end_lsn >= batch.end_lsn


def test_a_read_that_cannot_wait_long_enough_says_where_and_what_to_change(sandbox: Sandbox) -> None:
    t = prepare(sandbox)
    start = confirmed_flush(sandbox)
    sandbox.execute(f"INSERT INTO {t} SELECT g, 'bulk' FROM generate_series(1, 30000) g")
    with pytest.raises(DecodeTimeout, match=r"takes longer to decode.*raise cdc\.max_seconds") as failure:
        read_changes(sandbox.url, sandbox.slot, sandbox.publication, start, max_seconds=0.001, decode_wait_seconds=0.01)
    assert failure.value.transient and sandbox.slot in str(failure.value)
    assert confirmed_flush(sandbox) == start  # nothing acknowledged
