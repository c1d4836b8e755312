"""A typed CSV column that becomes text keeps each file's own text (`1e3`, `TRUE`, a time's offset as written), in
the same slice as the file that made it text and in every later file; rows already in the target, converted by
the destination when the column became text, are named in a warning that says how to re-read them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ingestion_assets_tests.files_helpers import Drops, Target, target, target_catalog

__all__ = ["target"]  # the fixture: each test once on DuckDB, once on PostgreSQL

W1 = "id,amount,ts,flag\n1,1.50,2026-01-01T10:00:00+02:00,TRUE\n2,1e3,2026-01-01T10:00:00Z,False\n"
W2 = "id,amount,ts,flag\n3,abc,soon,maybe\n"
W3 = "id,amount,ts,flag\n4,2.50,2026-02-01T00:00:00+01:00,FALSE\n"
AS_WRITTEN = [
    (1, "1.50", "2026-01-01T10:00:00+02:00", "TRUE"),
    (2, "1e3", "2026-01-01T10:00:00Z", "False"),
    (3, "abc", "soon", "maybe"),
    (4, "2.50", "2026-02-01T00:00:00+01:00", "FALSE"),
]


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


J1 = '{"id": 1, "amount": 10, "flag": true}\n{"id": 2, "amount": -0, "flag": false}\n{"id": 3, "amount": 1.50}\n'
J2 = '{"id": 4, "amount": "abc", "flag": "maybe"}\n'
J3 = '{"id": 5, "amount": 7, "flag": true}\n{"id": 6, "amount": 2.5e1}\n{"id": 7, "amount": -0}\n'
JSON_AS_WRITTEN = [
    (1, "10", "true"),
    (2, "-0", "false"),
    (3, "1.50", None),
    (4, "abc", "maybe"),
    (5, "7", "true"),
    (6, "2.5e1", None),
    (7, "-0", None),
]


def _json_rows(target: Target) -> list[tuple[object, ...]]:
    return target.query("SELECT id, amount, flag FROM drops.orders ORDER BY id")


def test_json_lines_keep_their_text_when_a_column_becomes_text(target: Target) -> None:
    drops = target.drops
    drops.write("j1.jsonl", J1, 1_700_000_000)
    drops.write("j2.jsonl", J2, 1_700_000_100)
    target_catalog(target, "*.jsonl")
    drops.run()
    drops.write("j3.jsonl", J3, 1_700_000_200)  # a later run: numbers read into a text column keep their text
    drops.run()
    assert _json_rows(target) == JSON_AS_WRITTEN


def test_a_refresh_gives_json_rows_loaded_before_a_column_became_text_their_text(tmp_path: Path) -> None:
    drops = Drops(tmp_path)
    drops.write("j1.jsonl", J1, 1_700_000_000)
    drops.catalog(path="*.jsonl", primary_key="id")
    drops.run()
    drops.write("j2.jsonl", J2, 1_700_000_100)
    drops.write("j3.jsonl", J3, 1_700_000_200)
    drops.run()
    target = Target(drops)
    assert _json_rows(target)[3:] == JSON_AS_WRITTEN[3:]  # read after the change: their own text
    assert _json_rows(target)[0][1] != "10"  # converted by the destination, as the run's warning says
    latest = drops.store.latest(None)
    assert latest is not None
    drops.store.commit(None, latest.position, **{**latest.details, "refresh_requested": "remove"})  # ingest refresh
    drops.run()
    assert _json_rows(target) == JSON_AS_WRITTEN
