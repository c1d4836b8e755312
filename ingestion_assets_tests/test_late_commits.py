"""Late commits: a transaction open across a sync commits rows whose cursor lies behind the rows the sync read.
The checkpoint never passes what such a transaction could still commit, so the next sync reads them."""

from __future__ import annotations

import psycopg2
import pytest

from ingestion_assets_tests.helpers import StreamHarness

TABLE = """
CREATE TABLE orders (id bigserial PRIMARY KEY, note text, updated_at timestamptz NOT NULL DEFAULT now());
INSERT INTO orders (note, updated_at) SELECT 'old ' || g, timestamptz '2024-01-01+00' + g * interval '1 s'
FROM generate_series(1, 100) g;
"""


def _catalog(harness: StreamHarness, **late: object) -> None:
    harness.write_catalog(
        {
            "orders": {
                "table": "orders",
                "primary_key": "id",
                "cursor": "updated_at",
                "slice_rows": 40,
                "late_commits": {"wait_seconds": 0.3, **late},
            }
        }
    )


@pytest.mark.parametrize("written_before_the_sync", [True, False])
def test_a_transaction_open_across_a_sync_is_not_lost(harness: StreamHarness, written_before_the_sync: bool) -> None:
    harness.source.execute(TABLE)
    _catalog(harness)
    harness.materialize()
    late = psycopg2.connect(harness.source.url, application_name="shop-app")
    try:
        with late.cursor() as cur:
            cur.execute(f'SET search_path = "{harness.source.schema}"')
            cur.execute("SELECT now()")  # the transaction begins: its now() is fixed from here
            if written_before_the_sync:
                cur.execute("INSERT INTO orders (note) VALUES ('late, written before the sync')")
        harness.source.execute("INSERT INTO orders (note) SELECT 'on time ' || g FROM generate_series(1, 50) g")
        result = harness.materialize()
        note = result.asset_materializations_for_node(f"{harness.source_name}__orders")[0].metadata["late commits"]
        assert "shop-app" in str(note.value)
        with late.cursor() as cur:
            if not written_before_the_sync:
                cur.execute("INSERT INTO orders (note) VALUES ('late, written after the sync')")
        late.commit()  # commits rows stamped with a now() older than every row the sync read
    finally:
        late.close()
    harness.materialize()
    harness.assert_target_equals_source("orders", "orders", "id")
    assert harness.target_count("orders") == 151


def test_without_open_transactions_the_checkpoint_reaches_the_last_row(harness: StreamHarness) -> None:
    harness.source.execute(TABLE)
    _catalog(harness)
    harness.materialize()
    checkpoint = harness.checkpoint("orders")
    assert checkpoint is not None and checkpoint.position == {"updated_at": "2024-01-01T00:01:40+00:00", "id": "100"}
    result = harness.materialize()
    rows = result.asset_materializations_for_node(f"{harness.source_name}__orders")[0].metadata["rows read"].value
    assert rows == 0


def test_a_long_reader_does_not_hold_the_checkpoint_for_ever(harness: StreamHarness) -> None:
    """A transaction that wrote nothing for longer than max_reader_seconds is taken for a report."""
    harness.source.execute(TABLE)
    _catalog(harness, max_reader_seconds=0.5)
    reader = psycopg2.connect(harness.source.url, application_name="nightly-report")
    try:
        with reader.cursor() as cur:
            cur.execute("SELECT pg_sleep(0.6)")
        result = harness.materialize()
        note = result.asset_materializations_for_node(f"{harness.source_name}__orders")[0].metadata["late commits"]
        assert "taken for readers" in str(note.value) and "nightly-report" in str(note.value)
        checkpoint = harness.checkpoint("orders")
        assert checkpoint is not None and checkpoint.position is not None and checkpoint.position["id"] == "100"
    finally:
        reader.close()


def test_a_transaction_taken_for_a_reader_that_writes_after_all_is_caught_once_it_ends(harness: StreamHarness) -> None:
    """Taken for a reader (nothing written for longer than max_reader_seconds), the checkpoint went on without it;
    it then wrote a row stamped with its own start and committed: behind the checkpoint, never read, every later
    check passed (found by a README-only attack). Once such a transaction has ended, the next run compares the whole
    table and reads again by key what it finds missing."""
    harness.source.execute(TABLE)
    _catalog(harness, max_reader_seconds=0.5)
    harness.materialize()
    late = psycopg2.connect(harness.source.url, application_name="batch-job")
    try:
        with late.cursor() as cur:
            cur.execute(f'SET search_path = "{harness.source.schema}"')
            cur.execute("SELECT now(), pg_sleep(0.7)")  # open, nothing written, for longer than max_reader_seconds
        harness.source.execute("INSERT INTO orders (note) SELECT 'on time ' || g FROM generate_series(1, 5) g")
        harness.materialize()  # the checkpoint passes the batch job's start
        with late.cursor() as cur:
            cur.execute("INSERT INTO orders (note) VALUES ('written by the job, stamped with its start')")
        late.commit()
    finally:
        late.close()
    result = harness.materialize()
    check = next(e for e in result.get_asset_check_evaluations() if e.check_name == "reconciliation")
    assert check.passed and check.metadata["scope"].value == "full", check.metadata
    assert harness.assert_target_equals_source("orders", "orders", "id") == 106
