"""Every pgoutput message kind that real DML produces, decoded from a real server's stream."""

from __future__ import annotations

import time

from ingestion_assets.sources.postgres.cdc import UNCHANGED_TOAST, ReplicationStream
from ingestion_assets.sources.postgres.cdc.messages import (
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Relation,
    Truncate,
    TypeInfo,
    Update,
)
from ingestion_assets_tests.cdc.sandbox import SENTINEL, Sandbox


def read_until_sentinel(box: Sandbox, start_lsn: int = 0, **options: object) -> list[Message]:
    """Messages up to a non-transactional logical message emitted after the DML: no guessing about timing."""
    box.query("SELECT pg_logical_emit_message(false, %s, 'end')", (SENTINEL,))
    received: list[Message] = []
    deadline = time.monotonic() + 20
    with ReplicationStream(box.url, box.slot, box.publication, start_lsn, messages=True, **options) as stream:  # type: ignore[arg-type]
        while time.monotonic() < deadline:
            item = stream.next(timeout=0.5)
            if item is None:
                continue
            message = item[1]
            if isinstance(message, LogicalMessage) and message.prefix == SENTINEL:
                return received
            received.append(message)
    raise AssertionError(f"no sentinel after {len(received)} messages")


def create_slot(box: Sandbox) -> None:
    box.query("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (box.slot,))


def test_every_dml_message_kind(sandbox: Sandbox) -> None:
    t, f = sandbox.qualified("t"), sandbox.qualified("f")
    sandbox.execute(
        f"CREATE TYPE \"{sandbox.schema}\".mood AS ENUM ('sad', 'happy')",
        f'CREATE TABLE {t} (id int PRIMARY KEY, name text, big text, mood "{sandbox.schema}".mood, n numeric)',
        f"ALTER TABLE {t} ALTER COLUMN big SET STORAGE EXTERNAL",  # out of line, uncompressed: TOASTed for sure
        f"CREATE TABLE {f} (id int, v text)",
        f"ALTER TABLE {f} REPLICA IDENTITY FULL",
        f"CREATE PUBLICATION {sandbox.publication} FOR TABLE {t}, {f}",
    )
    create_slot(sandbox)
    big = "x" * 100_000
    sandbox.execute(
        f"INSERT INTO {t} VALUES (1, 'a', %s, 'happy', NULL), (2, NULL, 'small', NULL, 1.50)", params=(big,)
    )
    sandbox.execute(f"UPDATE {t} SET name = 'b' WHERE id = 1")  # big is TOASTed and unchanged
    sandbox.execute(f"UPDATE {t} SET id = 10 WHERE id = 2")  # the key changes: old key sent
    sandbox.execute(f"DELETE FROM {t} WHERE id = 10")
    sandbox.execute(f"INSERT INTO {f} VALUES (1, 'x')", f"UPDATE {f} SET v = 'y'", f"DELETE FROM {f}")
    sandbox.execute("SELECT pg_logical_emit_message(true, 'pfx', 'hello')", f"INSERT INTO {f} VALUES (2, NULL)")
    sandbox.execute(f"TRUNCATE {t}, {f} RESTART IDENTITY CASCADE")

    messages = read_until_sentinel(sandbox)

    kinds = [type(m).__name__ for m in messages]
    assert kinds.count("Begin") == kinds.count("Commit") == 7
    relations = {m.name: m for m in messages if isinstance(m, Relation)}
    assert [c.name for c in relations["t"].columns] == ["id", "name", "big", "mood", "n"]
    assert [c.is_key for c in relations["t"].columns] == [True, False, False, False, False]
    assert relations["f"].replica_identity == "f" and all(c.is_key for c in relations["f"].columns)
    assert any(isinstance(m, TypeInfo) and m.name == "mood" and m.namespace == sandbox.schema for m in messages)

    inserts = [m for m in messages if isinstance(m, Insert)]
    assert inserts[0].new == ("1", "a", big, "happy", None)
    assert inserts[1].new == ("2", None, "small", None, "1.50")
    updates = [m for m in messages if isinstance(m, Update)]
    assert updates[0].old is None and updates[0].new == ("1", "b", UNCHANGED_TOAST, "happy", None)
    assert updates[1].old_kind == "key" and updates[1].old == ("2", None, None, None, None)
    assert updates[1].new == ("10", None, "small", None, "1.50")
    assert updates[2].old_kind == "full" and updates[2].old == ("1", "x") and updates[2].new == ("1", "y")
    deletes = [m for m in messages if isinstance(m, Delete)]
    assert (deletes[0].old_kind, deletes[0].old) == ("key", ("10", None, None, None, None))
    assert (deletes[1].old_kind, deletes[1].old) == ("full", ("1", "y"))

    (message,) = [m for m in messages if isinstance(m, LogicalMessage)]
    assert (message.transactional, message.prefix, message.content, message.xid) == (True, "pfx", b"hello", None)
    (truncate,) = [m for m in messages if isinstance(m, Truncate)]
    assert truncate.cascade and truncate.restart_identity
    assert set(truncate.relation_ids) == {relations["t"].relation_id, relations["f"].relation_id}

    begins = [m for m in messages if isinstance(m, Begin)]
    commits = [m for m in messages if isinstance(m, Commit)]
    for begin, commit in zip(begins, commits, strict=True):
        assert begin.final_lsn == commit.commit_lsn < commit.end_lsn
        assert begin.commit_time == commit.commit_time and begin.commit_time.tzinfo is not None
    assert [c.commit_lsn for c in commits] == sorted(c.commit_lsn for c in commits)


def test_origin_of_a_replicated_transaction(sandbox: Sandbox) -> None:
    t = sandbox.qualified("t")
    origin = f"origin_{sandbox.tag}"
    sandbox.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)", f"CREATE PUBLICATION {sandbox.publication} FOR TABLE {t}")
    create_slot(sandbox)
    sandbox.query("SELECT pg_replication_origin_create(%s)", (origin,))
    try:
        with sandbox.connect(autocommit=False) as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_replication_origin_session_setup(%s)", (origin,))
            cur.execute("SELECT pg_replication_origin_xact_setup('0/AB', now())")
            cur.execute(f"INSERT INTO {t} VALUES (1)")
            conn.commit()
            cur.execute("SELECT pg_replication_origin_session_reset()")
            conn.commit()
        messages = read_until_sentinel(sandbox)
    finally:
        sandbox.query("SELECT pg_replication_origin_drop(%s)", (origin,))
    (found,) = [m for m in messages if isinstance(m, Origin)]
    assert (found.name, found.commit_lsn) == (origin, 0xAB)
