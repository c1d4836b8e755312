"""A file column typed narrower in a later file than the target's column (integers after it became text, dates in
a timestamp column) loads in the column's type: no schema change, no pause, every value present as the file wrote
it; an accepted change whose conversion would lose a value the target holds changes nothing. On DuckDB and
PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from ingestion_assets_tests.files_helpers import Target, target, target_catalog

__all__ = ["target"]  # the fixture: each test once on DuckDB, once on PostgreSQL

BASE = 1_700_000_000.0
CODES = [[(1, "7"), (2, "8")], [(3, "A-3"), (4, "9")], [(5, "10"), (6, "0011")], [(1, "12")]]  # 1 updated last


def _csv(rows: list[tuple[int, str]]) -> str:
    return "id,code\n" + "".join(f"{i},{c}\n" for i, c in rows)


def _jsonl(rows: list[tuple[int, str]]) -> str:
    typed = [(i, c if not c.isdigit() or c.startswith("0") else int(c)) for i, c in rows]  # 7, "A-3", "0011"
    return "".join(json.dumps({"id": i, "code": c}) + "\n" for i, c in typed)


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_integers_after_text_load_as_text(target: Target, kind: str) -> None:
    target_catalog(target, f"*.{kind}")
    write = _csv if kind == "csv" else _jsonl
    for n, rows in enumerate(CODES):
        target.drops.write(f"{n}.{kind}", write(rows), BASE + n)
        target.drops.run()  # never paused
    expected = {i: c for rows in CODES for i, c in rows}
    assert target.query("SELECT id, code FROM drops.orders ORDER BY id") == sorted(expected.items())
    assert target.column_type("code") in ("varchar", "text", "character varying")


def test_dates_in_a_timestamp_column_load_as_midnight(target: Target) -> None:
    target_catalog(target, "*.csv")
    target.drops.write("1.csv", "id,at\n1,2024-01-02 03:04:05\n", BASE + 1)
    target.drops.run()
    target.drops.write("2.csv", "id,at\n2,2024-02-03\n", BASE + 2)
    target.drops.run()  # never paused
    target.drops.write("3.csv", "id,at\n3,2024-03-04 05:06:07\n", BASE + 3)
    target.drops.run()
    rows = target.query('SELECT id, "at" FROM drops.orders ORDER BY id')
    naive = [dt.datetime(2024, 1, 2, 3, 4, 5), dt.datetime(2024, 2, 3), dt.datetime(2024, 3, 4, 5, 6, 7)]  # noqa: DTZ001
    assert rows == list(enumerate(naive, 1))

