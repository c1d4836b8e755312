"""An API's JSON numbers land equal to the JSON text the server sent, value by value, on DuckDB and PostgreSQL:
decimals exact with their digits (a 19-digit amount, 1.50, 0.30000000000000004 were doubles), integers past int64
exact (they failed the whole load), a key past int64, numbers inside objects and lists (flattened columns, child
tables) with every digit, and a field of integers meeting decimals in a later slice widened, not paused."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from ingestion_assets.demo.api_server import DemoApi
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.rest.helpers import write_api_catalog

RECORDS = """[
 {"id": 1, "amount": 1234567890.123456789, "price": 1.50, "ratio": 0.30000000000000004, "big": 18446744073709551617,
  "huge": 1234567890123456789012345678901234567890, "sci": 2.5e-3, "count": 3,
  "obj": {"x": 0.1234567890123456789, "n": 1.50, "i": 7, "big": 123456789012345678901234567890},
  "items": [{"p": 2.25, "q": 12345678901234567890.5}, {"p": 0.1, "q": 7}]},
 {"id": 92233720368547758070001, "amount": -0.10, "price": 10.05, "ratio": 0.1, "big": -5, "huge": 1,
  "sci": 1e3, "count": 4, "obj": {"x": 1, "n": 2.50, "i": -1, "big": 2}, "items": []},
 {"id": 3, "amount": 0, "price": -0.01, "ratio": 0.2, "big": 123456789012345678901234567890, "huge": 2,
  "sci": -7.5E+2, "count": 5, "obj": null, "items": [{"p": 1e400, "q": -0.0}]}
]"""
LATER = """[{"id": 4, "price": 12.345, "count": 2.5, "amount": 1.1, "ratio": 1, "big": 1, "huge": 9876543210987654321098765432109876543210, "sci": 1,
  "obj": {"x": 2, "n": 3, "i": 5, "big": 3}, "items": []}]"""
COLUMNS = ["id", "amount", "price", "ratio", "big", "huge", "sci", "count", "obj__x", "obj__n", "obj__i", "obj__big"]


def _written(text: str) -> list[dict[str, Any]]:
    """The records as the server writes them: every number with its digits (Decimal keeps them, ints are ints)."""
    return list(json.loads(text, parse_float=Decimal))


def _same(written: Any, value: Any) -> bool:
    """A target value is the written number: exact types of equal value, or the text as written."""
    if isinstance(value, str):
        return value == (written if isinstance(written, str) else str(written))
    return isinstance(value, int | Decimal) and not isinstance(value, bool) and Decimal(value) == Decimal(written)


def _flat(record: dict[str, Any]) -> dict[str, Any]:
    obj = record.get("obj") or {}
    return {**record, **{f"obj__{k}": v for k, v in obj.items()}}


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_api_numbers_land_equal_to_their_json_text(harness: StreamHarness, empty_api: DemoApi, destination: str) -> None:
    write_api_catalog(harness, empty_api, destination=destination)
    empty_api.put("orders", _written(RECORDS))
    harness.materialize()
    empty_api.put("orders", _written(LATER))
    harness.materialize()
    schema = harness.source_name
    order = "ORDER BY CAST(id AS DECIMAL(38,0))"
    rows = harness.query_target(f'SELECT {", ".join(COLUMNS)} FROM "{schema}".orders {order}')
    written = sorted((_flat(r) for r in [*_written(RECORDS), *_written(LATER)]), key=lambda r: r["id"])
    assert len(rows) == len(written)
    for row, record in zip(rows, written, strict=True):
        for name, value in zip(COLUMNS, row, strict=True):
            expected = record.get(name)
            assert (value is None) == (expected is None), (record["id"], name, value)
            if name == "sci":
                assert value == float(expected), (record["id"], name, value)
            elif expected is not None:
                assert _same(expected, value), (record["id"], name, value, expected)
    items = harness.query_target(
        f'SELECT o.id, i.p, i.q FROM "{schema}".orders__items i JOIN "{schema}".orders o ON i._dlt_parent_id = o._dlt_id '
        "ORDER BY o.id, i._dlt_list_idx"
    )
    expected_items = [(r["id"], i["p"], i["q"]) for r in _written(RECORDS) for i in r["items"]]
    assert [int(r[0]) for r in items] == [i[0] for i in expected_items]
    for row, expected in zip(items, expected_items, strict=True):  # inside lists, numbers keep their text
        assert _same(expected[1], row[1]) and _same(expected[2], row[2]), (row, expected)


def test_price_keeps_its_scale_and_widens(harness: StreamHarness, empty_api: DemoApi) -> None:
    """`1.50` landed as the double 1.5; a later 12.345 widens numeric(4,2) to numeric(5,3), and an integer field
    meeting 2.5 becomes numeric(20,1) (it paused as incompatible: a double cannot hold every integer)."""
    write_api_catalog(harness, empty_api)
    empty_api.put("orders", _written(RECORDS))
    harness.materialize()
    price = f'SELECT id, CAST(price AS VARCHAR) FROM "{harness.source_name}".orders ORDER BY id'
    assert [r[1] for r in harness.query_target(price)] == ["1.50", "-0.01", "10.05"]
    empty_api.put("orders", _written(LATER))
    result = harness.materialize()
    check = next(c for c in result.get_asset_check_evaluations() if c.check_name == "schema")
    changes = check.metadata["changes applied"].value
    assert any("'price'" in c and "numeric(4,2) -> numeric(5,3)" in c for c in changes), changes
    assert any("'count'" in c and "bigint -> numeric(20,1)" in c for c in changes), changes
    types = {str(r[0]): str(r[1]) for r in harness.query_target(f'DESCRIBE "{harness.source_name}".orders')}
    assert types["price"] == "DECIMAL(5,3)" and types["count"] == "DECIMAL(20,1)" and types["huge"] == "VARCHAR"
