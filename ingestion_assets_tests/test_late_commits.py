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
