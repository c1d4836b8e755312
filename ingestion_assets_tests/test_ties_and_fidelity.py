"""Rows that share a cursor value across slice boundaries, and values that must arrive exactly."""

from __future__ import annotations

import pytest

from ingestion_assets_tests.helpers import SourceDb, StreamHarness


def test_thousands_of_rows_on_one_timestamp_all_arrive(harness: StreamHarness) -> None:
    harness.source.execute(
        """
        CREATE TABLE ticks (id integer PRIMARY KEY, v text, updated_at timestamptz NOT NULL);
        INSERT INTO ticks SELECT g, 'v' || g, timestamptz '2024-05-05 05:05:05.555555+00'
        FROM generate_series(1, 6000) g;
        """
    )
    harness.write_catalog({"ticks": {"table": "ticks", "primary_key": "id", "cursor": "updated_at", "slice_rows": 700}})
    harness.materialize()
    harness.assert_target_equals_source("ticks", "ticks", "id")

    # more rows on the very timestamp of the checkpoint, and an update of a row behind it
    harness.source.execute(
        """
        INSERT INTO ticks SELECT g, 'late' || g, timestamptz '2024-05-05 05:05:05.555555+00'
        FROM generate_series(6001, 9000) g;
        UPDATE ticks SET v = 'updated', updated_at = timestamptz '2024-05-05 05:05:05.555556+00' WHERE id = 17;
        """
    )
    harness.materialize()
    assert harness.assert_target_equals_source("ticks", "ticks", "id") == 9000


def test_nullable_cursor_and_composite_key(harness: StreamHarness) -> None:
    harness.source.execute(
        """
        CREATE TABLE lines (order_id int, line int, qty int, changed_on date, PRIMARY KEY (order_id, line));
        INSERT INTO lines SELECT g / 10, g % 10, g, CASE WHEN g % 4 = 0 THEN NULL ELSE date '2024-01-01' + g / 50 END
        FROM generate_series(1, 3000) g;
        """
    )
    harness.write_catalog(
        {
            "lines": {
                "table": "lines",
                "primary_key": ["order_id", "line"],
                "cursor": "changed_on",
                "slice_rows": 250,
            }
        }
    )
    harness.materialize()
    harness.source.execute("UPDATE lines SET qty = -1, changed_on = date '2030-01-01' WHERE order_id = 7")
    harness.materialize()
    assert harness.assert_target_equals_source("lines", "lines", "order_id, line") == 3000


FIDELITY_TABLE = """
CREATE TABLE fidelity (
    id bigint PRIMARY KEY,
    zip text, code varchar(10), flag boolean, small smallint, big bigint,
    amount numeric(38,9), ratio numeric(5,4), loose numeric, real_value double precision, dbl double precision,
    at_tz timestamptz, at_local timestamp, day date, clock time,
    doc jsonb, doc_json json, blob bytea, uid uuid, note text, tiny real,
    updated_at timestamptz NOT NULL
);
INSERT INTO fidelity VALUES
 (1, '00501', '007', true, -32768, 9223372036854775807, 12345678901234567890123456789.123456789, 0.0001,
  123456789012345678901234567890.123456789012345678901234567890, 3.4028235e38, 1.7976931348623157e308,
  '2024-02-29 23:59:59.999999+14:00', '2024-02-29 23:59:59.999999', '0001-01-01', '23:59:59.999999',
  '{"a": [1, 2.5, "x"], "nested": {"k": null}}', '{"keep": "order",  "spacing": 1}', '\\x00ff10', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
  'unicode: ü ß 中文 🙂 and "quotes", commas,
newlines', 1.5, '2024-01-01 00:00:00.000001+00'),
 (2, '', '', false, 0, -9223372036854775808, -0.000000001, -9.9999, 0, 'NaN', 'Infinity',
  '1970-01-01 00:00:00+00', '1970-01-01 00:00:00', '9999-12-31', '00:00:00',
  'null', '[]', '\\x', NULL, '', 'NaN', '2024-01-01 00:00:00.000001+00'),
 (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '-Infinity',
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '2024-01-01 00:00:00.000002+00'),
 (4, '0000', ' padded ', true, 1, 1, 0.1, 0.5, -1e-20, -0.0, 5e-324,
  '2000-01-01 12:00:00.123456-08:00', '2000-01-01 12:00:00.123456', '2000-01-01', '12:00:00',
  '"just a string"', '"s"', '\\xdeadbeef', '00000000-0000-0000-0000-000000000000', 'NULL', '-Infinity',
  '2024-01-01 00:00:00.000002+00');
"""


def test_edge_values_round_trip_exactly(harness: StreamHarness) -> None:
    _fidelity_round_trip(harness)


@pytest.mark.parametrize("any_source_db", ["system"], indirect=True)
def test_edge_values_round_trip_exactly_on_the_system_postgres(
    harness_on_any: StreamHarness, any_source_db: SourceDb
) -> None:
    _fidelity_round_trip(harness_on_any)


def _fidelity_round_trip(harness: StreamHarness) -> None:
    harness.source.execute(FIDELITY_TABLE)
    harness.write_catalog(
        {"fidelity": {"table": "fidelity", "primary_key": "id", "cursor": "updated_at", "slice_rows": 2}}
    )
    harness.materialize()
    harness.assert_target_equals_source(
        "fidelity", "fidelity", "id", json_columns=["doc", "doc_json"], decimal_text_columns=["loose"]
    )
    checkpoint = harness.checkpoint("fidelity")
    assert checkpoint is not None
    assert checkpoint.position == {"updated_at": "2024-01-01T00:00:00.000002+00:00", "id": "4"}
