"""A row a CDC stream parks leaves the dead letters when it loads later, whatever its key's types: the change
parks under the key text the load releases by (`record_keys`), and rows parked before under the log's own text
of the key are released too. On the embedded PostgreSQL and a DuckDB file."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from ingestion_assets.loading.dead_letters import key_part, key_values, record_keys
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.test_cdc_real_schemas import FAST
from ingestion_assets_tests.test_cdc_streams import cdc

__all__ = ["cdc"]  # the fixture that drops the slot and publication a test leaves

KEY = ("at", "ts", "day", "clock", "flag", "uid", "blob", "r", "n")
# A key of every scalar type whose text PostgreSQL and Arrow spell differently (and some they spell alike).
KEYED = f"""
CREATE TABLE keyed (at timestamptz, ts timestamp, day date, clock time, flag bool, uid uuid, blob bytea,
                    r float8, n numeric(6,2), amount numeric(10,2), PRIMARY KEY ({", ".join(KEY)}));
INSERT INTO keyed VALUES ('2024-01-01 00:00:00+00', '2024-01-01 12:30:00', '2024-01-01', '12:30:00', true,
                          'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\\x00ff', 0.1, 1.50, 1);
"""
MORE = """
INSERT INTO keyed VALUES
 ('2024-01-02 03:04:05.5+00', '2024-01-02 03:04:05.25', '2024-01-02', '03:04:05.5', false,
  'b0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12', '\\x7c5c', 1e20, -2.00, 'NaN'),
 ('2024-01-03 00:00:00+00', '2024-01-03 00:00:00', '2024-01-03', '00:00:00', true,
  'c0eebc99-9c0b-4ef8-bb6d-6bb9bd380a13', '\\x', 1.5e-7, 0, 'NaN');
"""


def _parked(harness: StreamHarness) -> list[str]:
    rows = harness.query_target_if_exists(
        f'SELECT record_key FROM "{harness.source_name}"._ingest_dead_letter ORDER BY record_key'
    )
    return [row[0] for row in rows]


def _log_text(harness: StreamHarness, day: str) -> str:
    """The key of the row of `day` as the log's text (what a CDC stream parked rows under before)."""
    with harness.source.connect() as conn, conn.cursor() as cur:
        cur.execute("SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET extra_float_digits = 3")
        outputs = ", ".join(f"format('%%s', {k})" for k in KEY)  # each type's output text ('t', not 'true')
        cur.execute(f"SELECT {outputs} FROM keyed WHERE day = %s", (day,))
        values = cur.fetchone()
    return "|".join(key_part(value) for value in values)


def test_a_parked_change_with_keys_of_any_type_is_released_when_its_row_loads(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(KEYED)
    harness.write_catalog({"keyed": {"table": "keyed", "primary_key": list(KEY)}}, mode="cdc", cdc=FAST)
    harness.materialize()  # the first row, copied
    harness.source.execute(MORE)
    harness.materialize()  # two rows from the log: NaN has no decimal value, both parked
    parked = _parked(harness)
    assert len(parked) == 2, parked
    assert harness.target_count("keyed") == 1
    # One of them as a stream parked it before keys had one text: under the log's text of its key.
    old = _log_text(harness, "2024-01-03")
    assert old not in parked
    table = f'"{harness.source_name}"._ingest_dead_letter'
    harness.execute_target(f"UPDATE {table} SET record_key = '{old}' WHERE record_key LIKE '%2024-01-03%'")
    assert old in _parked(harness)

    harness.source.execute("UPDATE keyed SET amount = 2 WHERE amount = 'NaN'")  # fixed at the source
    harness.materialize()
    assert _parked(harness) == []  # both released: the rows are in the target
    assert harness.query_target(f'SELECT day, amount FROM "{harness.source_name}".keyed ORDER BY day') == (
        harness.query_source("SELECT day, amount FROM keyed ORDER BY day")
    )


def test_every_key_type_has_a_text_that_reads_back_as_its_values() -> None:
    """Bytes that are not UTF-8 and lists stopped `record_keys` (Arrow has no cast of them to text): a stream
    with such a key and one dead letter failed every later load that looked for parked keys."""
    table = pa.table(
        {
            "blob": pa.array([b"\x00\xff", b"a|b", None]),
            "ints": pa.array([[1, 2], [], None], pa.list_(pa.int64())),
            "at": pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.UTC)] * 3, pa.timestamp("us", "UTC")),
        }
    )
    texts = record_keys(table, ["blob", "ints", "at"]).to_pylist()
    assert [key_values(text) for text in texts] == [
        ["\\x00ff", "[1, 2]", "2024-01-01 00:00:00.000000Z"],
        ["\\x617c62", "[]", "2024-01-01 00:00:00.000000Z"],
        [None, None, "2024-01-01 00:00:00.000000Z"],
    ]
