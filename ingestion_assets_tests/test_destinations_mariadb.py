"""MariaDB through dlt's sqlalchemy destination: a second SQL target, equal to the source value by value."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from ingestion_assets_tests.destination_targets import MariaDb, json_value, mariadb, use_destination
from ingestion_assets_tests.helpers import StreamHarness

__all__ = ["mariadb"]

ORDERS = """
CREATE TABLE orders (
    id bigint PRIMARY KEY, "Customer Name" text, note text, amount numeric(12, 2), paid boolean, placed date,
    payload jsonb, blob bytea, score double precision, updated_at timestamptz NOT NULL
);
INSERT INTO orders SELECT g, 'customer ' || g, CASE WHEN g % 3 = 0 THEN '' WHEN g % 3 = 1 THEN NULL ELSE 'ü ✓ ' || g END,
    g * 1.25, g % 2 = 0, date '2024-01-01' + g, jsonb_build_object('n', g, 'tags', jsonb_build_array('a', g)),
    decode(lpad(to_hex(g), 8, '0'), 'hex'), g / 7.0, timestamptz '2024-01-01 00:00:00.123456+00' + g * interval '1 s'
FROM generate_series(1, 1200) g;
INSERT INTO orders VALUES (5000, 'big', repeat('x', 100000), 0, NULL, NULL, NULL, NULL, NULL, now());
"""
COLUMNS = ["id", "customer_name", "note", "amount", "paid", "placed", "payload", "blob", "score", "updated_at"]


def _catalog(harness: StreamHarness, mariadb: MariaDb, disposition: str = "merge") -> None:
    harness.write_catalog(
        {
            "orders": {
                "table": "orders",
                "primary_key": "id",
                "cursor": "updated_at",
                "write_disposition": disposition,
                "slice_rows": 500,
            }
        }
    )
    use_destination(harness, mariadb.destination())
    mariadb.datasets.append(harness.source_name)


def _assert_equal(harness: StreamHarness, mariadb: MariaDb) -> None:
    expected = harness.source.rows("orders", "id")
    actual = [
        (*row[:4], None if row[4] is None else bool(row[4]), row[5], json_value(row[6]), *row[7:])
        for row in mariadb.rows(harness.source_name, "orders", COLUMNS, "id")
    ]
    assert len(actual) == len(expected)
    differ = [(e, a) for e, a in zip(expected, actual, strict=True) if e != a]
    assert not differ, f"first differences (source, target): {differ[:3]}"


@pytest.mark.slow
def test_a_table_stream_merges_into_mariadb_value_for_value(harness: StreamHarness, mariadb: MariaDb) -> None:
    harness.source.execute(ORDERS)
    _catalog(harness, mariadb)
    harness.materialize()
    _assert_equal(harness, mariadb)
    assert mariadb.rows(harness.source_name, "orders", ["note"], "id")[2] == ("",)  # '' stays '', not NULL
    harness.source.execute(
        "UPDATE orders SET note = 'changed', amount = -1.5, updated_at = now() WHERE id % 100 = 0;"
        "INSERT INTO orders VALUES (6000, 'new', 'A', 1, true, '2025-01-01', '{}', '\\x00', 0, now())"
    )
    harness.materialize()
    _assert_equal(harness, mariadb)
    checkpoint = harness.checkpoint("orders")
    assert checkpoint is not None and checkpoint.details["target"]["where"].startswith("sqlalchemy:file:")


def test_keys_differing_only_in_case_or_trailing_spaces_stay_distinct(harness: StreamHarness, mariadb: MariaDb) -> None:
    """MariaDB's default collation matches 'a', 'A' and 'a ': the merge would delete one with the other."""
    harness.source.execute(
        "CREATE TABLE codes (code text PRIMARY KEY, label text, updated_at timestamptz NOT NULL);"
        "INSERT INTO codes VALUES ('a', 'lower', now()), ('A', 'upper', now()), ('a ', 'space', now())"
    )
    harness.write_catalog({"codes": {"table": "codes", "primary_key": "code", "cursor": "updated_at"}})
    use_destination(harness, mariadb.destination())
    mariadb.datasets.append(harness.source_name)
    harness.materialize()
    harness.source.execute("UPDATE codes SET label = 'lower again', updated_at = now() WHERE code = 'a'")
    harness.materialize()
    assert mariadb.rows(harness.source_name, "codes", ["code", "label"], "label") == [
        ("a", "lower again"),
        ("a ", "space"),
        ("A", "upper"),
    ]
    # dlt's merge deletes WHERE EXISTS (staging row of the key): both tables are indexed on the key, a text key
    # by its prefix (without, a 20k-row merge into 60k rows ran for over 11 minutes: the lakes attack)
    indexed = mariadb.query(
        "SELECT table_schema, column_name, sub_part FROM information_schema.statistics "
        f"WHERE table_name = 'codes' AND index_name = 'ingest_key' AND table_schema LIKE '{harness.source_name}%' "
        "ORDER BY table_schema"
    )
    assert indexed == [(harness.source_name, "code", 255), (f"{harness.source_name}_staging", "code", 255)]


@pytest.mark.slow
def test_a_refresh_swaps_in_a_new_generation_without_the_deleted_rows(harness: StreamHarness, mariadb: MariaDb) -> None:
    harness.source.execute(ORDERS)
    _catalog(harness, mariadb, "replace")
    harness.materialize()
    harness.source.execute("DELETE FROM orders WHERE id <= 100; UPDATE orders SET note = 'renamed' WHERE id > 1100")
    harness.materialize()
    _assert_equal(harness, mariadb)
    generations = mariadb.query(f"SELECT DISTINCT _ingest_generation_id FROM `{harness.source_name}`.orders")
    assert generations == [(2,)]


@pytest.mark.slow
def test_values_mariadb_cannot_hold_are_parked_with_their_reason(harness: StreamHarness, mariadb: MariaDb) -> None:
    harness.source.execute(
        "CREATE TABLE odd (id int PRIMARY KEY, score float8, day date, updated_at timestamptz NOT NULL);"
        "INSERT INTO odd VALUES (1, 1.5, '2024-05-01', now()), (2, 'NaN', '2024-05-01', now()),"
        "(3, '-Infinity', '2024-05-01', now()), (4, 0, '0900-01-01', now()), (5, NULL, NULL, now())"
    )
    harness.write_catalog({"odd": {"table": "odd", "primary_key": "id", "cursor": "updated_at"}})
    use_destination(harness, mariadb.destination())
    mariadb.datasets.append(harness.source_name)
    result = harness.materialize()
    metadata = result.asset_materializations_for_node(f"{harness.source_name}__odd")[0].metadata
    assert metadata["dead letters"].value == 3  # the run says so
    loaded = mariadb.rows(harness.source_name, "odd", ["id", "score", "day"], "id")
    assert loaded == [(1, 1.5, dt.date(2024, 5, 1)), (5, None, None)]
    parked = mariadb.query(
        f"SELECT record_key, error FROM `{harness.source_name}`._ingest_dead_letter ORDER BY record_key"
    )
    assert [key for key, _ in parked] == ["2", "3", "4"]
    assert "NaN or infinity" in parked[0][1] and "years 1000-9999" in parked[2][1]
    assert Decimal(1) == Decimal(loaded[0][0])
