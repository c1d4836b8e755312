"""Readiness checks, publications, slot health and WAL gaps, on real servers."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg2
import pytest

from ingestion_assets.sources.postgres.cdc import (
    CdcError,
    Problem,
    ReplicationStream,
    SlotInUseError,
    acknowledge,
    check_cdc,
    drop_slot,
    ensure_publication,
    find_gap,
    read_changes,
    slot_health,
)
from ingestion_assets.sources.postgres.cdc.marks import publication_marks
from ingestion_assets.sources.postgres.cdc.publication import Ensured
from ingestion_assets_tests.cdc.sandbox import Sandbox, confirmed_flush, prepare, wal_level


def messages(problems: Sequence[Problem]) -> str:
    return "\n".join(str(p) for p in problems)


def test_wal_level_is_checked_on_every_server(server_url: str) -> None:
    problems = check_cdc(server_url, "no_such_slot", "no_such_pub", [], expect_slot=False)
    wal_problems = [p for p in problems if "wal_level" in p.message]
    if wal_level(server_url) == "logical":
        assert wal_problems == []
    else:
        assert wal_problems and "ALTER SYSTEM SET wal_level = logical" in wal_problems[0].message


def test_a_ready_setup_has_no_problems_and_each_fault_is_named(sandbox: Sandbox) -> None:
    t = prepare(sandbox)
    keyless = sandbox.qualified("keyless")
    sandbox.execute(f"CREATE TABLE {keyless} (a int, b text)")
    table = sandbox.table("t")
    assert check_cdc(sandbox.url, sandbox.slot, sandbox.publication, [table]) == []

    problems = check_cdc(sandbox.url, sandbox.slot, sandbox.publication, [table, sandbox.table("keyless")])
    text = messages(problems)
    assert f"does not include table {keyless}; ALTER PUBLICATION" in text
    assert f"table {keyless}: has no primary key" in text and f"ALTER TABLE {keyless} REPLICA IDENTITY FULL" in text
    sandbox.execute(f"ALTER TABLE {keyless} REPLICA IDENTITY FULL")
    assert ensure_publication(sandbox.url, sandbox.publication, [table, sandbox.table("keyless")]).added == (
        sandbox.table("keyless"),
    )
    assert check_cdc(sandbox.url, sandbox.slot, sandbox.publication, [table, sandbox.table("keyless")]) == []
    nothing = sandbox.qualified("nothing")  # a key, but an identity that sends none: the fix is DEFAULT, not a key
    sandbox.execute(f"CREATE TABLE {nothing} (a int PRIMARY KEY); ALTER TABLE {nothing} REPLICA IDENTITY NOTHING")
    said = messages(check_cdc(sandbox.url, sandbox.slot, sandbox.publication, [sandbox.table("nothing")]))
    assert f"ALTER TABLE {nothing} REPLICA IDENTITY DEFAULT" in said and "add a primary key" not in said

    missing = check_cdc(sandbox.url, sandbox.slot, "pub_missing", [table])
    assert [p.subject for p in missing] == ["publication 'pub_missing'"]
    assert f'CREATE PUBLICATION "pub_missing" FOR TABLE {t}' in missing[0].message

    assert check_cdc(sandbox.url, "slot_missing", sandbox.publication, [table], expect_slot=False) == []
    assert "does not exist" in messages(check_cdc(sandbox.url, "slot_missing", sandbox.publication, [table]))


def test_an_active_slot_is_reported_and_refused(sandbox: Sandbox) -> None:
    prepare(sandbox)
    with ReplicationStream(sandbox.url, sandbox.slot, sandbox.publication) as stream:
        stream.next(timeout=0.2)
        (problem,) = check_cdc(sandbox.url, sandbox.slot, sandbox.publication, [sandbox.table("t")])
        assert problem.subject == f"slot {sandbox.slot!r}" and "in use by process" in problem.message
        assert "pg_terminate_backend(" in problem.message
        with pytest.raises(SlotInUseError, match=f"{sandbox.slot}' is in use"):
            ReplicationStream(sandbox.url, sandbox.slot, sandbox.publication, slot_wait_seconds=0.2).__enter__()
    assert check_cdc(sandbox.url, sandbox.slot, sandbox.publication, [sandbox.table("t")]) == []


def test_reading_without_the_publication_names_it(sandbox: Sandbox) -> None:
    prepare(sandbox)
    with pytest.raises(CdcError, match=r"publication 'pub_missing' does not exist.*ensure_publication"):
        read_changes(sandbox.url, sandbox.slot, "pub_missing", None)


def test_publication_is_created_then_extended_only_by_what_it_lacks(sandbox: Sandbox) -> None:
    for name in ("a", "b"):
        sandbox.execute(f"CREATE TABLE {sandbox.qualified(name)} (id int PRIMARY KEY)")
    a, b = sandbox.table("a"), sandbox.table("b")
    assert ensure_publication(sandbox.url, sandbox.publication, [a]).added == (a,)
    assert ensure_publication(sandbox.url, sandbox.publication, [a, b]).added == (b,)
    assert ensure_publication(sandbox.url, sandbox.publication, [a, b]).added == ()


def test_publication_says_which_row_version_its_own_alter_replaced(sandbox: Sandbox) -> None:
    """The run tells its own ALTER PUBLICATION from an operator's by the row version it replaced: reported by
    the one call that altered, read on the connection it is given (which stays open for the marks)."""
    sandbox.execute(f"CREATE TABLE {sandbox.qualified('plain')} (id int PRIMARY KEY)")
    sandbox.execute(f"CREATE TABLE {sandbox.qualified('parted')} (id int PRIMARY KEY) PARTITION BY RANGE (id)")
    plain, parted = sandbox.table("plain"), sandbox.table("parted")
    sandbox.execute(f"CREATE PUBLICATION {sandbox.publication} FOR TABLE {sandbox.qualified('plain')}")
    version = "SELECT oid::text || '/' || xmin::text FROM pg_publication WHERE pubname = %s"
    before = sandbox.query(version, (sandbox.publication,))[0][0]
    assert ensure_publication(sandbox.url, sandbox.publication, [plain]) == Ensured((), None)
    conn = psycopg2.connect(sandbox.url)
    try:
        conn.autocommit = True
        ensured = ensure_publication(sandbox.url, sandbox.publication, [plain, parted], conn=conn)
        assert ensured == Ensured((parted,), before)  # publish_via_partition_root turned on, the table added
        marks = publication_marks(sandbox.url, sandbox.publication, [plain, parted], conn=conn)
        assert not conn.closed
    finally:
        conn.close()
    after = sandbox.query(version, (sandbox.publication,))[0][0]
    assert after != before and marks[parted]["publication"] == marks[plain]["publication"] == after
    assert ensure_publication(sandbox.url, sandbox.publication, [plain, parted]) == Ensured((), None)


def test_slot_health_follows_retained_wal_and_gaps_are_found(sandbox: Sandbox) -> None:
    t = prepare(sandbox)
    start = confirmed_flush(sandbox)
    before = slot_health(sandbox.url, sandbox.slot)
    assert (before.active, before.confirmed_flush_lsn, before.wal_status) == (False, start, "reserved")
    sandbox.execute(f"INSERT INTO {t} SELECT g, repeat('w', 200) FROM generate_series(1, 5000) g")
    sandbox.query("CHECKPOINT")  # logs the running transactions: a point the slot can later restart from
    grown = slot_health(sandbox.url, sandbox.slot)
    assert grown.retained_wal_bytes > before.retained_wal_bytes + 1_000_000
    assert grown.lag_bytes > before.lag_bytes + 1_000_000 and grown.current_lsn > before.current_lsn

    batch = read_changes(sandbox.url, sandbox.slot, sandbox.publication, start, max_changes=100_000)
    assert len(batch) == 5000
    assert find_gap(sandbox.url, sandbox.slot, start) is None  # nothing acknowledged yet
    acknowledge(sandbox.url, sandbox.slot, sandbox.publication, batch.end_lsn)
    caught_up = slot_health(sandbox.url, sandbox.slot)
    assert caught_up.confirmed_flush_lsn == batch.end_lsn and caught_up.lag_bytes < grown.lag_bytes
    # the next read decodes from restart_lsn and moves it to the last logged point before the acknowledged one
    read_changes(sandbox.url, sandbox.slot, sandbox.publication, batch.end_lsn)
    released = slot_health(sandbox.url, sandbox.slot)
    assert released.restart_lsn is not None and released.restart_lsn > (before.restart_lsn or 0)

    assert find_gap(sandbox.url, sandbox.slot, batch.end_lsn) is None
    gap = find_gap(sandbox.url, sandbox.slot, start)  # a checkpoint behind what the slot was told
    assert gap is not None and "past the stored checkpoint" in gap.reason and "lost to this slot" in gap.reason
    assert gap.acknowledged_lsn == batch.end_lsn  # only checkpoints behind it are concerned
    assert drop_slot(sandbox.url, sandbox.slot) is True and drop_slot(sandbox.url, sandbox.slot) is False
    gone = find_gap(sandbox.url, sandbox.slot, batch.end_lsn)
    assert gone is not None and "no longer exists" in gone.reason
    assert "drop the slot" not in gone.reason  # it is gone: what to do now, not what was done (attack24)


def test_a_published_partitioned_table_whose_partition_has_no_identity_is_taken_out(sandbox: Sandbox) -> None:
    """REPLICA IDENTITY FULL on a partitioned table does not reach its partitions, where the rows are written:
    a partition without a key of its own still makes the application's UPDATE fail."""
    from ingestion_assets.sources.postgres.cdc.identity import unpublish_unidentified

    parent, leaf = sandbox.qualified("p"), sandbox.qualified("p_1")
    sandbox.execute(
        f"CREATE TABLE {parent} (id int, v text) PARTITION BY RANGE (id)",
        f"CREATE TABLE {leaf} PARTITION OF {parent} FOR VALUES FROM (0) TO (100)",
        f"ALTER TABLE {parent} REPLICA IDENTITY FULL",
        f"INSERT INTO {parent} VALUES (1, 'a')",
    )
    sandbox.execute(f"CREATE PUBLICATION {sandbox.publication} FOR TABLE {parent}")
    found = unpublish_unidentified(sandbox.url, sandbox.publication, [sandbox.table("p")], owned=True)
    assert [(e.table, e.removed) for e in found] == [(sandbox.table("p"), True)]
    assert f"has partition {leaf} that has no primary key" in found[0].reason
    sandbox.execute(f"UPDATE {parent} SET v = 'b' WHERE id = 1")  # out of the publication: the update works
    assert (
        unpublish_unidentified(sandbox.url, sandbox.publication, [sandbox.table("p")], owned=True)[0].removed is False
    )
