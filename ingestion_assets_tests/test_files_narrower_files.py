"""A file column typed narrower in a later file than the target's column (integers after it became text, dates in
a timestamp column) loads in the column's type: no schema change, no pause, every value present as the file wrote
it; an accepted change whose conversion would lose a value the target holds changes nothing. On DuckDB and
PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from ingestion_assets.streams.schema_step import SchemaPaused
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


def test_an_accepted_change_that_would_lose_values_changes_nothing(target: Target) -> None:
    """Doubles (1.25e-7) meeting an integer past 2**53 pause; accepted, a bigint would round 1.25e-7 to 0: the run
    refuses, naming stream, column and value, and the target keeps every value."""
    target_catalog(target, "*.csv")
    target.drops.write("1.csv", "id,rate\n1,1.25e-7\n2,1e3\n", BASE + 1)
    target.drops.run()
    target.drops.write("2.csv", f"id,rate\n3,{2**60 + 1}\n", BASE + 2)
    with pytest.raises(SchemaPaused, match="changed type double precision -> bigint"):
        target.drops.run()
    latest = target.drops.store.latest(None)
    assert latest is not None
    target.drops.store.commit(None, latest.position, **{**latest.details, "schema_accepted": True})
    with pytest.raises(SchemaPaused, match=r"stream drops.orders is paused: its column 'rate'.*e-07.*ingest refresh"):
        target.drops.run()
    assert target.query("SELECT id, rate FROM drops.orders ORDER BY id") == [(1, 1.25e-7), (2, 1000.0)]
    assert target.column_type("rate") in ("double", "double precision")
    target_catalog(target, "*.csv", csv={"column_types": {"rate": "string"}})  # what the refusal suggests
    latest = target.drops.store.latest(None)
    assert latest is not None
    target.drops.store.commit(None, latest.position, **{**latest.details, "refresh_requested": "remove"})
    target.drops.run()  # ingest refresh: every file again, into a new table
    written = [(1, "1.25e-7"), (2, "1e3"), (3, str(2**60 + 1))]
    assert target.query("SELECT id, rate FROM drops.orders ORDER BY id") == written
