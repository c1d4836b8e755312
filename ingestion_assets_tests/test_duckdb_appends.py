"""Slices no target row can match (a first full read into an empty table, an `append` stream) go from Arrow
into DuckDB without a dlt load each; the target, its binding and dlt's stored schema stay what dlt made."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from ingestion_assets_tests.helpers import StreamHarness

ROWS = 3_000
SLICE = 1_000
ORDERS = f"""
CREATE TABLE orders (
    id bigint PRIMARY KEY, sku text NOT NULL, total numeric(38,9) NOT NULL, ratio real, note text,
    token uuid, waited interval, tags int[], meta jsonb, placed_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
INSERT INTO orders
SELECT g, lpad((g % 200)::text, 6, '0'), round((g * 3.7)::numeric, 2) + (g % 1000) * 0.000000001,
       CASE WHEN g % 11 = 0 THEN '-0' WHEN g % 13 = 0 THEN 'NaN' ELSE g / 7.0 END,
       CASE WHEN g % 10 = 0 THEN NULL WHEN g % 10 = 1 THEN '' ELSE 'note ' || g END,
       md5(g::text)::uuid, make_interval(months => g % 3, days => g % 40, secs => g / 1000.0),
       CASE WHEN g % 5 = 0 THEN NULL ELSE ARRAY[g, NULL, -g] END,
       CASE WHEN g % 7 = 0 THEN NULL ELSE jsonb_build_object('n', g, 'x', repeat('é', g % 4)) END,
       timestamptz '2024-01-01 00:00:00+00' + g * interval '3 seconds 7 microseconds',
       timestamptz '2024-03-01 00:00:00+00' + (g / 3) * interval '1 ms'
FROM generate_series(1, {ROWS}) g;
"""
COLUMNS = ("id", "sku", "total", "note", "token", "waited", "tags", "placed_at", "updated_at")


def _prepare(harness: StreamHarness, **options: Any) -> None:
    harness.source.execute(ORDERS)
    spec = {"table": "orders", "primary_key": "id", "cursor": "updated_at", "slice_rows": SLICE, **options}
    harness.write_catalog({"orders": spec})


def _dlt_loads(harness: StreamHarness) -> int:
    return int(harness.query_target(f'SELECT count(*) FROM "{harness.source_name}"._dlt_loads')[0][0])


def _stored_columns(harness: StreamHarness) -> set[str]:
    """The columns dlt's newest stored schema gives the stream's table (what `ingest schema` and dlt merge use)."""
    rows = harness.query_target(
        f'SELECT schema FROM "{harness.source_name}"._dlt_version ORDER BY inserted_at DESC LIMIT 1'
    )
    return set(json.loads(rows[0][0])["tables"]["orders"]["columns"])


def _equal_to_source(harness: StreamHarness) -> None:
    """Value for value, types included: `real` as the same 32-bit float (-0 and NaN too), jsonb as the same JSON."""
    expected = harness.query_source("SELECT id, ratio::float8, meta::text FROM orders ORDER BY id")
    actual = harness.query_target(
        f'SELECT id, CAST(ratio AS DOUBLE), CAST(meta AS VARCHAR) FROM "{harness.source_name}".orders ORDER BY id'
    )

    def same(row: tuple[Any, ...]) -> tuple[Any, ...]:
        key, ratio, meta = row
        exact = None if ratio is None else ("nan" if math.isnan(ratio) else (ratio, math.copysign(1, ratio)))
        return key, exact, None if meta is None else json.loads(meta)

    assert [same(r) for r in actual] == [same(r) for r in expected]
    source = harness.source.rows("orders", "id")
    names = harness.source.columns("orders")
    wanted = [names.index(c) for c in COLUMNS]
    assert harness.target_rows("orders", list(COLUMNS), "id") == [tuple(row[i] for i in wanted) for row in source]


def test_a_first_full_read_appends_its_slices_without_a_dlt_load_each(harness: StreamHarness) -> None:
    _prepare(harness)
    harness.materialize()
    _equal_to_source(harness)
    types = dict(
        harness.query_target(
            "SELECT column_name, data_type FROM information_schema.columns "
            f"WHERE table_schema = '{harness.source_name}' AND table_name = 'orders'"
        )
    )
    assert (types["total"], types["ratio"], types["token"], types["waited"], types["tags"], types["meta"]) == (
        "DECIMAL(38,9)",
        "FLOAT",
        "UUID",
        "INTERVAL",
        "INTEGER[]",
        "JSON",
    )
    assert _dlt_loads(harness) == 1  # the empty slice that made the table; the three slices went in directly
    assert set(types) <= _stored_columns(harness)
    checkpoint = harness.checkpoint("orders")
    assert checkpoint is not None and checkpoint.details["target"]["seq"] == ROWS // SLICE
    assert harness.query_target(f'SELECT seq FROM "{harness.source_name}"._ingest_bindings') == [(ROWS // SLICE,)]

    # the next run merges in SQL into what the direct appends made: still no dlt load
    harness.source.execute("UPDATE orders SET note = 'changed', updated_at = now() WHERE id IN (5, 1500, 2999)")
    harness.source.execute(
        "INSERT INTO orders SELECT id + 10000, sku, total, ratio, note, token, waited, tags, meta, "
        "placed_at, now() FROM orders WHERE id <= 3"
    )
    harness.materialize()
    assert _dlt_loads(harness) == 1
    _equal_to_source(harness)


def test_an_append_stream_adds_every_version_and_a_new_column(
    harness: StreamHarness, capfd: pytest.CaptureFixture[str]
) -> None:
    _prepare(harness, write_disposition="append", reconcile={"scope": "off"})
    harness.materialize()
    # the version column's merge-only hint is not given to dlt's appends (dlt warned about it on every run)
    assert "dedup_sort" not in "".join(capfd.readouterr())
    harness.source.execute("ALTER TABLE orders ADD COLUMN channel text")
    harness.source.execute("UPDATE orders SET channel = 'web', updated_at = now() WHERE id IN (7, 8)")
    harness.materialize()
    rows = harness.query_target(
        f'SELECT id, channel, count(*) OVER (PARTITION BY id) FROM "{harness.source_name}".orders '
        "WHERE id IN (7, 8) ORDER BY id, channel NULLS FIRST"
    )
    assert rows == [(7, None, 2), (7, "web", 2), (8, None, 2), (8, "web", 2)]
    assert int(harness.query_target(f'SELECT count(*) FROM "{harness.source_name}".orders')[0][0]) == ROWS + 2
    assert "channel" in _stored_columns(harness)
    assert _dlt_loads(harness) == 2  # the table made, then the column added: no slice loaded through dlt
