"""A PostgreSQL table stream end to end: full load, then only changes, target equal to source."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from ingestion_assets_tests.helpers import StreamHarness

ORDERS = """
CREATE TABLE orders (
    id bigint PRIMARY KEY, customer text, amount numeric(12,2), status text NOT NULL,
    updated_at timestamptz NOT NULL, payload jsonb
);
INSERT INTO orders
SELECT g, 'c' || g % 97, g * 1.25, 'new', timestamptz '2024-01-01 00:00:00+00' + (g / 7) * interval '1 second',
       jsonb_build_object('n', g)
FROM generate_series(1, 5000) g;
"""


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_changes_after_a_run_arrive_in_the_next_run(harness: StreamHarness, destination: str) -> None:
    harness.source.execute(ORDERS)
    harness.write_catalog(
        {"orders": {"table": "orders", "primary_key": "id", "cursor": "updated_at", "slice_rows": 1000}},
        destination=destination,
    )
    harness.materialize()
    assert harness.assert_target_equals_source("orders", "orders", "id", json_columns=["payload"]) == 5000
    first = harness.checkpoint("orders")
    assert first is not None and first.position == {"updated_at": "2024-01-01T00:11:54+00:00", "id": "5000"}

    harness.source.execute(
        """
        UPDATE orders SET status = 'paid', amount = amount + 1, updated_at = statement_timestamp()
        WHERE id % 10 = 0;
        INSERT INTO orders SELECT g, 'late', 1, 'new', statement_timestamp(), NULL FROM generate_series(5001, 5300) g;
        UPDATE orders SET payload = NULL, updated_at = statement_timestamp() WHERE id = 3;
        """
    )
    result = harness.materialize()
    materialization = result.asset_materializations_for_node(f"{harness.source_name}__orders")[0]
    assert materialization.metadata["rows read"].value == 500 + 300 + 1  # only what changed was read
    harness.assert_target_equals_source("orders", "orders", "id", json_columns=["payload"])
    second = harness.checkpoint("orders")
    assert second is not None and second.position is not None and second.position["id"] == "5300"

    # a run with nothing new reads nothing and keeps the position
    result = harness.materialize()
    materialization = result.asset_materializations_for_node(f"{harness.source_name}__orders")[0]
    assert materialization.metadata["rows read"].value == 0
    last = harness.checkpoint("orders")
    assert last is not None and last.position == second.position


def test_a_reader_holding_the_warehouse_delays_a_load_instead_of_failing_it(harness: StreamHarness) -> None:
    """Found in CI: a test reading the DuckDB file while a run loaded failed the load ("Could not set lock")."""
    harness.source.execute(ORDERS)
    harness.write_catalog({"orders": {"table": "orders", "primary_key": "id", "cursor": "updated_at"}})
    harness.materialize()
    harness.source.execute("UPDATE orders SET status = 'paid', updated_at = statement_timestamp() WHERE id < 100")
    hold = "import duckdb, sys, time; c = duckdb.connect(sys.argv[1], read_only=True); print('held', flush=True); "
    hold += "time.sleep(3)"
    with subprocess.Popen(
        [sys.executable, "-c", hold, str(harness.warehouse)], stdout=subprocess.PIPE, text=True
    ) as reader:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "held"
        began = time.monotonic()
        harness.materialize()
        assert time.monotonic() - began > 1.0, "the load did not wait: the reader was gone already"
    harness.assert_target_equals_source("orders", "orders", "id", json_columns=["payload"])


# inet, time and bool take the same path as uuid (a type whose lowest value the catalog cannot spell): slow-marked
_SAME_PATH = pytest.mark.slow


@pytest.mark.parametrize(
    "kind",
    [
        "uuid",
        *(pytest.param(kind, marks=_SAME_PATH) for kind in ("inet", "time", "bool")),
        "mood",
        "int4range",
        "jsonb",
    ],
)
def test_a_nullable_cursor_of_a_type_without_an_empty_value_is_read(harness: StreamHarness, kind: str) -> None:
    """A NULL in an ordering column orders as the type's lowest value, which was '' for every type without a
    numeric or temporal one: the read failed with `invalid input syntax for type uuid: ""` (found by a helper)."""
    values = {
        "uuid": "(ARRAY[NULL, '00000000-0000-0000-0000-000000000001', 'ffffffff-0000-0000-0000-000000000000'])[1 + g % 3]::uuid",
        "inet": "(ARRAY[NULL, '10.0.0.1', '::1'])[1 + g % 3]::inet",
        "time": "(ARRAY[NULL, '00:00:00', '12:30:00'])[1 + g % 3]::time",
        "bool": "(ARRAY[NULL, 'false', 'true'])[1 + g % 3]::bool",
        # an enum orders by its labels' order: its lowest is its first label, which the catalog tells
        "mood": "(ARRAY[NULL, 'sad', 'happy'])[1 + g % 3]::mood",
        "int4range": "(ARRAY[NULL, 'empty', '[1,5)'])[1 + g % 3]::int4range",
        "jsonb": "(ARRAY[NULL, 'null', '{\"a\": 1}'])[1 + g % 3]::jsonb",
    }
    harness.source.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    harness.source.execute(
        f"CREATE TABLE items (id int PRIMARY KEY, c {kind}); INSERT INTO items SELECT g, {values[kind]}"
        " FROM generate_series(1, 30) g"
    )
    harness.write_catalog({"items": {"table": "items", "primary_key": "id", "cursor": "c", "slice_rows": 7}})
    # a range lands as PostgreSQL's text of it; jsonb as JSON
    harness.source.execute("CREATE VIEW items_text AS SELECT id, c::text AS c FROM items")
    source = "items_text" if kind == "int4range" else "items"
    json_columns = ["c"] if kind == "jsonb" else []
    harness.materialize()
    harness.assert_target_equals_source("items", source, "id", json_columns)
    newest = values[kind].replace("[1 + g % 3]", "[3]")  # at the newest value: after the checkpoint
    harness.source.execute(f"INSERT INTO items SELECT g, {newest} FROM generate_series(31, 36) g")
    harness.materialize()
    assert harness.assert_target_equals_source("items", source, "id", json_columns) == 36
