"""A keyed file read again whose line for a key went bad: the row the source holds now cannot load, so the target
keeps the key's previous version (never deleted: the key is still in the file), and the dead letter says so."""

from __future__ import annotations

import gzip

from ingestion_assets_tests.files_helpers import Target, target, target_catalog

__all__ = ["target"]  # the fixture: each test once on DuckDB, once on PostgreSQL

BASE = 1_700_000_000.0
KEEPS = "the target keeps the previous version of this row's key, if it held one, until the row loads"


def test_a_key_whose_line_went_bad_keeps_its_old_row_and_its_dead_letter_says_so(target: Target) -> None:
    target_catalog(target, "*.csv", csv={"column_types": {"amount": "float64"}})
    target.drops.write("a.csv", "id,name,amount\n1,a,1.5\n2,b,2.5\n3,c,3.5\n", BASE)
    target.drops.run()
    target.drops.write("a.csv", "id,name,amount\n1,A,1.5\n2,B,2.5,extra\n3,C,abc\n", BASE + 10)
    outcome = target.drops.run()
    assert outcome.result.dead_letters == 2
    assert target.query("SELECT id, name, amount FROM drops.orders ORDER BY id") == [
        (1, "A", 1.5),
        (2, "b", 2.5),  # kept: its line has a field too many
        (3, "c", 3.5),  # kept: its amount is no number
    ]
    assert target.dead_letters() == [
        ("a.csv:line3", f"file a.csv line 3: 4 fields where the header has 3; {KEEPS}"),
        ("a.csv:row3", f"file a.csv row 3 (line 4): column 'amount': 'abc' is not a valid double; {KEEPS}"),
    ]


def test_a_keyed_file_rewritten_unreadable_keeps_its_rows_and_its_dead_letter_says_so(target: Target) -> None:
    target_catalog(target, "*.jsonl.gz")
    target.drops.write("a.jsonl.gz", gzip.compress(b'{"id": 1, "name": "a"}\n'), BASE)
    target.drops.run()
    target.drops.write("a.jsonl.gz", b"\x1f\x8b not gzip at all", BASE + 10)
    target.drops.run()
    assert target.query("SELECT id, name FROM drops.orders") == [(1, "a")]
    ((key, error),) = target.dead_letters()
    assert key == "a.jsonl.gz:file"
    assert error.endswith(
        "; the target keeps the previous version of each key of this file's rows until the file loads"
    )
