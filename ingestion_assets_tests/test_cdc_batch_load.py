"""A batch of the log that changes several tables lands in ONE load (DuckDB): all of it or none of it, with
updates, key changes, soft and hard deletes, and a change older than the target's row left out."""

from __future__ import annotations

from decimal import Decimal

from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.test_cdc_streams import TABLE, _assert_exact, cdc  # noqa: F401 - the fixture

ITEMS = """
CREATE TABLE items (id int PRIMARY KEY, order_id int NOT NULL, note text, qty int NOT NULL);
INSERT INTO items SELECT g, g % 40 + 1, 'item ' || g, g FROM generate_series(1, 200) g;
"""
NEWER = Decimal(10**30)  # above every log position: a version another writer (a key-range partition) landed

# One transaction across both tables (a batch of one transaction: max_changes 1), then a later one.
CHANGES = """
UPDATE orders SET status = 'older', amount = 1 WHERE id = 7;
UPDATE orders SET status = 'paid', amount = amount + 1 WHERE id IN (1, 2, 3);
UPDATE orders SET id = 40000 WHERE id = 4;
UPDATE orders SET status = 'gone soon' WHERE id = 12;
DELETE FROM orders WHERE id IN (10, 11, 12);
INSERT INTO orders (id, status, amount) VALUES (30001, 'new', 2.5);
UPDATE items SET qty = qty * 10 WHERE order_id = 3;
DELETE FROM items WHERE id IN (2, 5);
INSERT INTO items VALUES (1000, 7, NULL, 1), (1001, 8, 'new item', 2);
"""


def _catalog(harness: StreamHarness) -> None:
    harness.write_catalog(
        {
            "orders": {"table": "orders", "primary_key": "id", "deletes": "soft"},
            "items": {"table": "items", "primary_key": "id", "deletes": "hard"},
        },
        mode="cdc",
        cdc={"max_changes": 1, "max_seconds": 2, "max_batches_per_run": 1, "retries": {"max_attempts": 1}},
    )


def _snapshot(harness: StreamHarness, table: str) -> list[tuple[object, ...]]:
    return harness.query_target(f'SELECT * FROM "{harness.source_name}".{table} ORDER BY id')


def _seq(harness: StreamHarness) -> dict[str, int]:
    rows = harness.query_target(f'SELECT stream, seq FROM "{harness.source_name}"._ingest_bindings')
    return {str(stream): int(seq) for stream, seq in rows}


def _assert_items_exact(harness: StreamHarness) -> None:
    harness.assert_target_equals_source("items", "items", "id")
    tombstones = harness.query_target(
        f'SELECT count(*) FROM "{harness.source_name}".items WHERE _ingest_deleted_at IS NOT NULL'
    )
    assert tombstones == [(0,)]  # hard deletes leave no row behind


def _newer_row(harness: StreamHarness) -> list[tuple[object, ...]]:
    return harness.query_target(f'SELECT status, _ingest_position FROM "{harness.source_name}".orders WHERE id = 7')


def test_a_batch_of_two_tables_lands_in_one_load_or_not_at_all(cdc: StreamHarness) -> None:  # noqa: F811
    harness = cdc
    harness.source.execute(TABLE + ITEMS)
    _catalog(harness)
    harness.materialize()  # the snapshot of both tables
    # Another writer already holds order 7 at the version the source will end with; the log's older change
    # of it (in this batch) must not overwrite it.
    harness.execute_target(
        f"UPDATE \"{harness.source_name}\".orders SET status = 'newest', amount = 1, _ingest_position = {NEWER} WHERE id = 7",
        # The target refuses a NULL note: one table of the batch fails to load (one load per table used to
        # leave the other table, or the failing table's deletes, committed without a checkpoint).
        f'ALTER TABLE "{harness.source_name}".items ALTER COLUMN note SET NOT NULL',
    )
    harness.source.execute(CHANGES)  # one transaction
    harness.source.execute("UPDATE orders SET status = 'newest' WHERE id = 7")  # a later transaction
    before = {table: _snapshot(harness, table) for table in ("orders", "items")}
    seq_before = _seq(harness)

    failed = harness.materialize(raise_on_error=False)
    assert not failed.success
    assert {table: _snapshot(harness, table) for table in ("orders", "items")} == before  # neither table moved
    assert _seq(harness) == seq_before

    harness.execute_target(f'ALTER TABLE "{harness.source_name}".items ALTER COLUMN note DROP NOT NULL')
    assert harness.materialize().success  # the same batch again: every table of it, in one load
    _assert_exact(harness)  # order 7 kept the newer writer's row, which is the source's current one
    _assert_items_exact(harness)
    assert _newer_row(harness) == [("newest", NEWER)]
    assert {name: seq - seq_before[name] for name, seq in _seq(harness).items()} == {"orders": 1, "items": 1}
    flagged = harness.query_target(
        f'SELECT id, status FROM "{harness.source_name}".orders WHERE _ingest_deleted_at IS NOT NULL ORDER BY id'
    )
    assert flagged == [(4, "new"), (10, "new"), (11, "new"), (12, "gone soon")]  # soft: the last values kept

    assert harness.materialize().success  # the later transaction: older than the target's row, left out
    _assert_exact(harness)
    assert _newer_row(harness) == [("newest", NEWER)]
