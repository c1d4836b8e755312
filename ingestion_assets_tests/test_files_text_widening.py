"""A typed CSV column that becomes text keeps each file's own text (`1e3`, `TRUE`, a time's offset as written), in
the same slice as the file that made it text and in every later file; rows already in the target, converted by
the destination when the column became text, are named in a warning that says how to re-read them."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingestion_assets_tests.files_helpers import Drops, Target, target_catalog, target_of

W1 = "id,amount,ts,flag\n1,1.50,2026-01-01T10:00:00+02:00,TRUE\n2,1e3,2026-01-01T10:00:00Z,False\n"
W2 = "id,amount,ts,flag\n3,abc,soon,maybe\n"
W3 = "id,amount,ts,flag\n4,2.50,2026-02-01T00:00:00+01:00,FALSE\n"
AS_WRITTEN = [
    (1, "1.50", "2026-01-01T10:00:00+02:00", "TRUE"),
    (2, "1e3", "2026-01-01T10:00:00Z", "False"),
    (3, "abc", "soon", "maybe"),
    (4, "2.50", "2026-02-01T00:00:00+01:00", "FALSE"),
]


@pytest.fixture(params=["duckdb", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    with target_of(request.param, tmp_path, request) as found:
        yield found


def _rows(target: Target) -> list[tuple[object, ...]]:
    return target.query("SELECT id, amount, ts, flag FROM drops.orders ORDER BY id")


def test_files_of_one_slice_keep_their_text_when_a_column_becomes_text(target: Target) -> None:
    drops = target.drops
    drops.write("w1.csv", W1, 1_700_000_000)
    drops.write("w2.csv", W2, 1_700_000_100)
    target_catalog(target, "*.csv")
    drops.run()
    drops.write("w3.csv", W3, 1_700_000_200)  # a later file: its typed-looking values read as the column's text
    drops.run()
    assert _rows(target) == AS_WRITTEN


def test_rows_already_loaded_when_a_column_becomes_text_are_named_in_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    drops = Drops(tmp_path)
    drops.write("w1.csv", W1, 1_700_000_000)
    drops.catalog(path="*.csv", primary_key="id")
    drops.run()
    drops.write("w2.csv", W2, 1_700_000_100)
    drops.write("w3.csv", W3, 1_700_000_200)
    with caplog.at_level(logging.WARNING):
        drops.run()
    warned = [r.getMessage() for r in caplog.records if "became text" in r.getMessage()]
    assert {w.split("column ")[1].split(" ")[0] for w in warned} == {"'amount'", "'ts'", "'flag'"}
    assert all("drops.orders" in w and "ingest refresh drops.orders" in w for w in warned)
    rows = drops.rows("id, amount, ts, flag")
    assert rows[2:] == AS_WRITTEN[2:]  # the files read after the change: their own text
    assert rows[0][1] == "1.5"  # converted by DuckDB, as the warning says
