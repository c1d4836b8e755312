"""A slot created with an exported snapshot: the copy under the snapshot plus the changes after it are the table."""

from __future__ import annotations

import random
import threading
import time

import pytest

from ingestion_assets.sources.postgres.cdc import CdcError, create_slot_with_snapshot, slot_health, use_snapshot
from ingestion_assets.sources.postgres.cdc.errors import SlotMissingError
from ingestion_assets_tests.cdc.sandbox import COLUMNS, Replica, Sandbox, read_all


def churn(box: Sandbox, stop: threading.Event, seed: int) -> None:
    """Small transactions of inserts, updates (some of the TOASTed column, some of the key) and deletes."""
    rng, t = random.Random(seed), box.qualified("t")
    keys, next_key = set(range(1, 501)), 10_000
    with box.connect() as conn, conn.cursor() as cur:
        while not stop.is_set():
            key = rng.choice(sorted(keys))
            action = rng.randrange(5)
            if action == 0:
                cur.execute(f"INSERT INTO {t} VALUES (%s, 'new', NULL, 0)", (next_key,))
                keys.add(next_key)
            elif action == 1:
                cur.execute(f"UPDATE {t} SET n = n + 1, name = NULL WHERE id = %s", (key,))
            elif action == 2:
                cur.execute(f"UPDATE {t} SET big = repeat(md5(random()::text), 200) WHERE id = %s", (key,))
            elif action == 3:
                cur.execute(f"UPDATE {t} SET id = %s WHERE id = %s", (next_key, key))
                keys.discard(key)
                keys.add(next_key)
            else:
                cur.execute(f"DELETE FROM {t} WHERE id = %s", (key,))
                keys.discard(key)
            next_key += 1


def copy_under(box: Sandbox, snapshot_name: str) -> dict[str, tuple[str | None, ...]]:
    with box.connect() as conn, conn.cursor() as cur:
        use_snapshot(cur, snapshot_name)
        cur.execute(f"SELECT id::text, id::text, name, big, n::text FROM {box.qualified('t')}")
        rows = {row[0]: tuple(row[1:]) for row in cur.fetchall()}
        cur.execute("COMMIT")
    return rows


def test_snapshot_copy_plus_changes_is_the_table(sandbox: Sandbox) -> None:
    t = sandbox.qualified("t")
    sandbox.execute(
        f"CREATE TABLE {t} (id int PRIMARY KEY, name text, big text, n numeric)",
        f"ALTER TABLE {t} ALTER COLUMN big SET STORAGE EXTERNAL",
        f"INSERT INTO {t} SELECT g, 'old', CASE WHEN g % 50 = 0 THEN repeat('z', 5000) END, g FROM generate_series(1, 500) g",
        f"CREATE PUBLICATION {sandbox.publication} FOR TABLE {t}",
    )
    stop = threading.Event()
    writer = threading.Thread(target=churn, args=(sandbox, stop, 3))
    writer.start()
    try:
        time.sleep(0.3)
        with create_slot_with_snapshot(sandbox.url, sandbox.slot) as snapshot:
            time.sleep(0.2)  # the table moves on; the snapshot does not
            copied = copy_under(sandbox, snapshot.snapshot_name)
        time.sleep(0.3)
    finally:
        stop.set()
        writer.join()

    replica = Replica(copied, strict=True)
    batches = read_all(sandbox, snapshot.consistent_lsn, max_changes=300)
    replica.apply(change for batch in batches for change in batch.changes)
    expected = sandbox.text_rows("t", ("id", *COLUMNS))
    assert replica.rows == expected
    assert copied != expected and sum(len(b) for b in batches) > 50  # the writer really raced the copy


def test_a_failed_copy_drops_the_slot_and_an_existing_slot_is_refused(sandbox: Sandbox) -> None:
    sandbox.execute(f"CREATE TABLE {sandbox.qualified('t')} (id int PRIMARY KEY)")
    with pytest.raises(RuntimeError, match="copy failed"), create_slot_with_snapshot(sandbox.url, sandbox.slot):
        raise RuntimeError("copy failed")
    with pytest.raises(SlotMissingError):
        slot_health(sandbox.url, sandbox.slot)

    with create_slot_with_snapshot(sandbox.url, sandbox.slot) as snapshot:
        assert snapshot.consistent_lsn > 0 and snapshot.snapshot_name
    with pytest.raises(CdcError, match=f"{sandbox.slot}' already exists.*drop_slot"):  # noqa: SIM117
        with create_slot_with_snapshot(sandbox.url, sandbox.slot):
            pass
    assert slot_health(sandbox.url, sandbox.slot).confirmed_flush_lsn == snapshot.consistent_lsn
