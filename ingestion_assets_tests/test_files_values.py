"""CSV and JSON lines values land equal to the file's text, value by value, on DuckDB and PostgreSQL: decimals as
exact decimals (`1.50` was a double, 1.5), booleans in any case, codes with leading zeros as text, integers past
int64 with every digit, and a column of integers meeting decimals in a later file widened, not paused. Also the
first run of a stream under `schema_policy: pause` (it paused on every column as added)."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from ingestion_assets.streams.schema_step import SchemaPaused
from ingestion_assets_tests.files_helpers import Drops, Target, target, target_catalog

__all__ = ["target"]  # the fixture: each test once on DuckDB, once on PostgreSQL

BASE = 1_700_000_000.0
COLUMNS = ["id", "price", "flag", "code", "big", "mixed", "ratio"]
FIRST = """id,price,flag,code,big,mixed,ratio
1,1.50,True,007,9223372036854775808,1,0.1
2,-0.25,false,010,-9223372036854775809,2,0.30000000000000004
3,100.000,TRUE,42,123456789012345678901234567890,3,-.5
"""
LATER = """id,mixed,price,ratio
4,1.5,3.14159,0.5
5,-2.25,0.1,1.
"""
JSON_LINES = [
    '{"id": 6, "price": 2.50, "flag": true, "code": "007", "big": 99999999999999999999, "mixed": 7, "ratio": 0.10}',
    '{"id": 7, "price": -0.001, "flag": false, "code": "8", "big": -5, "mixed": 1.25, "ratio": 12345678.123456789}',
]


def _texts() -> dict[tuple[int, str], Any]:
    """Each (id, column) of the files as written: CSV fields as text, JSON values as parsed exactly."""
    written: dict[tuple[int, str], Any] = {}
    for text in (FIRST, LATER):
        for row in csv.DictReader(io.StringIO(text)):
            written.update({(int(row["id"]), k): v for k, v in row.items()})
    for line in JSON_LINES:
        record = json.loads(line, parse_float=Decimal)
        written.update({(record["id"], k): v for k, v in record.items()})
    return written


def _same(written: Any, value: Any) -> bool:
    """A target value is the written one: a number of equal value (exact types only), a boolean of the text
    `true`/`false` in any case, a text of the same characters."""
    if isinstance(value, bool) or isinstance(written, bool):
        return str(value).lower() == str(written).lower()
    if isinstance(value, int | Decimal):
        return Decimal(value) == Decimal(str(written))
    return isinstance(value, str) and value == str(written)


def test_csv_and_json_values_land_equal_to_their_text(target: Target) -> None:
    target_catalog(target, "*")
    target.drops.write("1.csv", FIRST, BASE + 1)
    target.drops.write("2.csv", LATER, BASE + 2)
    target.drops.write("3.jsonl", "\n".join(JSON_LINES) + "\n", BASE + 3)
    outcome = target.drops.run()
    rows = target.query(f"SELECT {', '.join(COLUMNS)} FROM drops.orders ORDER BY id")
    written = _texts()
    assert [r[0] for r in rows] == [1, 2, 3, 4, 5, 6, 7]
    for row in rows:
        for name, value in zip(COLUMNS, row, strict=True):
            expected = written.get((row[0], name))
            assert (value is None) == (expected is None), (row[0], name, value)
            assert expected is None or _same(expected, value), (row[0], name, value, expected)
    assert not any(isinstance(v, float) for row in rows for v in row)  # no double rounds or drops a digit
    assert target.column_type("code") in ("varchar", "text", "character varying")
    assert target.column_type("flag") == "boolean"
    assert all(target.column_type(c).startswith(("decimal", "numeric")) for c in ("price", "big", "mixed", "ratio"))
    assert "column 'mixed' changed type bigint -> numeric(21,2) (widened)" in outcome.schema_changes


def test_a_decimal_keeps_its_scale_in_the_target(target: Target) -> None:
    """`1.50` landed as the double 1.5: the target's text of the value is the file's."""
    target_catalog(target, "*.csv")
    target.drops.write("1.csv", "id,price\n1,1.50\n2,10.05\n3,-0.10\n", BASE + 1)
    target.drops.run()
    cast = "CAST(price AS VARCHAR)" if target.url is None else "price::text"
    assert target.query(f"SELECT id, {cast} FROM drops.orders ORDER BY id") == [(1, "1.50"), (2, "10.05"), (3, "-0.10")]


def test_a_first_run_under_pause_adopts_the_files_columns(tmp_path: Path) -> None:
    """The first run paused on every column as 'added' (there was no schema to change yet); a later file that
    adds a column, or needs a wider type, still pauses."""
    drops = Drops(tmp_path)
    drops.catalog(path="*.csv", primary_key="id", schema_policy="pause")
    drops.write("1.csv", "id,name,amount\n1,a,1.50\n", BASE + 1)
    outcome = drops.run()
    assert outcome.schema_changes == []
    assert drops.rows() == [(1, "a", Decimal("1.50"))]
    drops.write("2.csv", "id,name,amount,note\n2,b,2.25,n\n", BASE + 2)
    with pytest.raises(SchemaPaused, match="column 'note' added"):
        drops.run()
    drops.write("2.csv", "id,name,amount\n2,b,12.345\n", BASE + 3)
    with pytest.raises(SchemaPaused, match=r"'amount' changed type numeric\(3,2\) -> numeric\(5,3\) \(widened\)"):
        drops.run()
    ignoring = Drops(tmp_path / "ignore")  # `ignore` skipped every column of the first run: rows of keys only
    ignoring.catalog(path="*.csv", primary_key="id", schema_policy="ignore")
    ignoring.write("1.csv", "id,name,amount\n1,a,1.50\n", BASE + 1)
    ignoring.run()
    assert ignoring.rows() == [(1, "a", Decimal("1.50"))]


def test_partitions_share_the_target_columns_types(tmp_path: Path) -> None:
    """Each partition's checkpoint has its own schema: a partition's first run took the target's columns as new
    and loaded 100.25 into the DECIMAL(3,2) another partition had created (the load failed), or text into its
    bigint column. A column the target holds is known by the type it holds there, and widened from it."""
    drops = Drops(tmp_path)
    partitions = {"by": "time", "pattern": "dt={date}/", "start": "2026-01-01", "granularity": "daily"}
    drops.catalog(path="**/*.csv", primary_key="id", partitions=partitions)
    drops.write("dt=2026-01-01/a.csv", "id,amount,code\n1,1.50,10\n", BASE + 1)
    drops.write("dt=2026-01-02/a.csv", "id,amount,code\n2,100.25,X-2\n3,7,30\n", BASE + 2)
    drops.run("2026-01-01")
    outcome = drops.run("2026-01-02")
    assert drops.rows("id, amount, code") == [(1, Decimal("1.50"), "10"), (2, Decimal("100.25"), "X-2"), (3, 7, "30")]
    assert sorted(outcome.schema_changes) == [
        "column 'amount' changed type numeric(3,2) -> numeric(5,2) (widened)",
        "column 'code' changed type bigint -> text (widened)",
    ]


def test_json_numbers_inside_nested_values_and_huge_integers_keep_their_text(tmp_path: Path) -> None:
    """A nested decimal of 19 digits became a JSON string ("0.1234567890123456789") and 1.50 became 1.5; an
    integer of more than 4300 digits failed the whole run (Python's limit on int conversion)."""
    drops = Drops(tmp_path)
    drops.catalog(path="*.jsonl", primary_key="id")
    huge = "7" * 5000
    nested = '{"x": 0.1234567890123456789, "n": 1.50, "l": [1e400, -0.0, 12345678901234567890123]}'
    drops.write("a.jsonl", f'{{"id": 1, "o": {nested}, "big": {huge}}}\n{{"id": 2, "o": null, "big": 1}}\n', BASE)
    drops.run()
    assert drops.rows("id, o, big") == [(1, nested, huge), (2, None, "1")]
