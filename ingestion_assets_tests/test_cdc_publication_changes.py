"""CDC streams whose publication an operator changed between two runs in a way the log cannot show (embedded
PostgreSQL 18, DuckDB): a table dropped from the publication and added back, the publication narrowed to some
actions or to a row filter and then restored. pgoutput leaves out every change the publication did not cover
when it was made, so the stream must be copied again, and each scenario ends with the target equal to the
source, row by row."""

from __future__ import annotations

import pytest

from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.test_cdc_real_schemas import CUSTOMERS, ORDERS, _assert_exact, _catalog, _failure, _metadata
from ingestion_assets_tests.test_cdc_streams import cdc

__all__ = ["cdc"]  # the fixture that drops the slot and publication a test leaves

CHANGES = "UPDATE orders SET note = 'changed' WHERE id < 5; DELETE FROM orders WHERE id BETWEEN 10 AND 12;" + (
    "INSERT INTO orders VALUES (5000, 'n', 1, 'new')"
)


def test_a_table_dropped_from_the_publication_and_added_back_is_copied_again(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(CUSTOMERS + ORDERS)
    _catalog(harness, {"customers": {}, "orders": {}})
    harness.materialize()
    publication = f"ingest_{harness.source_name}"
    harness.source.execute(f"ALTER PUBLICATION {publication} DROP TABLE orders")
    harness.source.execute(CHANGES + "; UPDATE customers SET name = 'x' WHERE id = 3")
    harness.source.execute(f"ALTER PUBLICATION {publication} ADD TABLE orders")
    result = harness.materialize(raise_on_error=False)
    assert result.success, _failure(result)
    orders, customers = _metadata(result, harness, "orders"), _metadata(result, harness, "customers")
    assert orders["copied"] is True and "publication" in orders["copy reason"]
    assert "copied" not in customers  # its table stayed published: its log is whole
    harness.materialize()
    _assert_exact(harness, "orders")
    _assert_exact(harness, "customers")
    assert "copied" not in _metadata(harness.materialize(), harness, "orders")  # once only


@pytest.mark.parametrize(
    "narrow",
    ["SET (publish = 'insert')", "SET TABLE customers, orders WHERE (id > 100)"],
)
def test_a_narrowed_publication_refuses_and_once_restored_its_tables_are_copied_again(
    cdc: StreamHarness, narrow: str
) -> None:
    harness = cdc
    harness.source.execute(CUSTOMERS + ORDERS)
    _catalog(harness, {"customers": {}, "orders": {}})
    harness.materialize()
    publication = f"ingest_{harness.source_name}"
    harness.source.execute(f"ALTER PUBLICATION {publication} {narrow}")
    harness.source.execute(CHANGES)
    message = _failure(harness.materialize(raise_on_error=False))
    assert f'ALTER PUBLICATION "{publication}"' in message
    restore = (
        "SET (publish = 'insert, update, delete, truncate')" if "publish" in narrow else "SET TABLE customers, orders"
    )
    harness.source.execute(f"ALTER PUBLICATION {publication} {restore}")
    result = harness.materialize(raise_on_error=False)
    assert result.success, _failure(result)
    assert _metadata(result, harness, "orders")["copied"] is True
    harness.materialize()
    _assert_exact(harness, "orders")
    _assert_exact(harness, "customers")


def test_a_renamed_enum_value_copies_the_tables_holding_it_again(cdc: StreamHarness) -> None:
    """ALTER TYPE ... RENAME VALUE changes what every row holding the label reads, with no change in the log."""
    harness = cdc
    harness.source.execute(
        "CREATE TYPE mood AS ENUM ('ok', 'sad'); CREATE DOMAIN moods AS mood[];"
        "CREATE TABLE feelings (id int PRIMARY KEY, m mood, ms moods);"
        "INSERT INTO feelings SELECT g, 'ok', ARRAY['sad', 'ok']::mood[] FROM generate_series(1, 50) g;" + CUSTOMERS
    )
    _catalog(harness, {"feelings": {}, "customers": {}})
    harness.materialize()
    harness.source.execute("ALTER TYPE mood ADD VALUE 'meh' BEFORE 'sad'")  # the rows read as they did
    result = harness.materialize()
    assert "copied" not in _metadata(result, harness, "feelings")
    harness.source.execute("ALTER TYPE mood RENAME VALUE 'ok' TO 'fine'; UPDATE feelings SET m = 'meh' WHERE id = 1")
    result = harness.materialize(raise_on_error=False)
    assert result.success, _failure(result)
    feelings = _metadata(result, harness, "feelings")
    assert feelings["copied"] is True and "'ok' -> 'fine'" in feelings["copy reason"]
    assert "copied" not in _metadata(result, harness, "customers")
    harness.materialize()
    source = harness.query_source("SELECT id, m::text, ms::text[] FROM feelings ORDER BY id")
    assert harness.target_rows_where("feelings", ["id", "m", "ms"], "id", "_ingest_deleted_at IS NULL") == source
    assert source[:2] == [(1, "meh", ["sad", "fine"]), (2, "fine", ["sad", "fine"])]
    _assert_exact(harness, "customers")
