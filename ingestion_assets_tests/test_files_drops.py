"""Drops as partners write them: a `.tsv` file is tab-separated, an empty file (0 bytes, of any format) is a drop
without rows, neither a broken file nor a dead letter."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import duckdb

from ingestion_assets_tests.files_helpers import Drops


def test_a_tsv_file_is_read_with_tabs_unless_the_catalog_says_otherwise(tmp_path: Path) -> None:
    drops = Drops(tmp_path)
    drops.write("a.tsv", "id\tname\tamount\n1\tx, y\t2.50\n", 1_700_000_000)
    drops.write("b.tsv.gz", gzip.compress(b"id\tname\tamount\n2\tz\t3\n"), 1_700_000_100)
    drops.catalog(path="*.tsv*", primary_key="id")
    drops.run()
    assert [(i, n, str(a)) for i, n, a in drops.rows()] == [(1, "x, y", "2.50"), (2, "z", "3.00")]


def test_a_quote_in_a_tsv_file_is_data_unless_the_catalog_gives_a_quote_char(tmp_path: Path) -> None:
    drops = Drops(tmp_path)
    drops.write("a.tsv", 'id\tname\tamount\n1\t"Hello" she said\t2\n2\t"open\t3\n3\tx "y"\t4\n', 1_700_000_000)
    drops.catalog(path="*.tsv", primary_key="id")
    outcome = drops.run()
    assert drops.rows() == [(1, '"Hello" she said', 2), (2, '"open', 3), (3, 'x "y"', 4)]
    assert outcome.result.dead_letters == 0
    quoted = Drops(tmp_path / "quoted")
    quoted.write("a.tsv", 'id\tname\tamount\n1\t"a\tb"\t2\n', 1_700_000_000)
    quoted.catalog(path="*.tsv", primary_key="id", csv={"quote_char": '"'})
    quoted.run()
    assert quoted.rows() == [(1, "a\tb", 2)]


def test_a_tsv_file_keeps_the_delimiter_a_catalog_gives(tmp_path: Path) -> None:
    drops = Drops(tmp_path)
    drops.write("a.tsv", "id;name;amount\n1;x\ty;2\n", 1_700_000_000)
    drops.catalog(path="*.tsv", primary_key="id", csv={"delimiter": ";"})
    drops.run()
    assert drops.rows() == [(1, "x\ty", 2)]


def test_an_empty_file_is_a_drop_without_rows(tmp_path: Path) -> None:
    drops = Drops(tmp_path)
    drops.write("a.csv", "id,name,amount\n1,x,2\n", 1_700_000_000)
    for name in ("empty.csv", "empty.jsonl", "empty.parquet"):
        drops.write(name, b"", 1_700_000_100)
    drops.write("empty.csv.gz", gzip.compress(b""), 1_700_000_100)
    drops.catalog(path="*", primary_key="id")
    outcome = drops.run()
    assert drops.rows() == [(1, "x", 2)]
    assert outcome.result.dead_letters == 0
    drops.run()  # read once: nothing due again
    assert drops.rows() == [(1, "x", 2)]


def test_a_quote_never_closed_parks_its_row_with_the_rows_it_swallowed(tmp_path: Path) -> None:
    drops = Drops(tmp_path)
    drops.write("a.csv", 'id,amount,name\n4,1,ok\n5,2,"unterminated\n6,3,after\n', 1_700_000_000)
    drops.write("b.csv", 'id,amount,name\n7,1,"two\nlines"\n8,2,"ends ""quoted""\n"', 1_700_000_100)  # closed
    drops.catalog(path="*.csv", primary_key="id")
    outcome = drops.run()
    assert drops.rows("id, name") == [(4, "ok"), (7, "two\nlines"), (8, 'ends "quoted"\n')]
    ((key, error),) = drops.dead_letters()
    assert key == "a.csv:row2"
    assert "'name'" in error and "never closed" in error
    assert outcome.result.dead_letters == 1


def test_a_json_key_spelled_in_another_case_is_that_column_and_only_a_record_giving_both_is_parked(
    tmp_path: Path,
) -> None:
    drops = Drops(tmp_path)
    lines = [
        '{"id": 1, "name": "a", "amount": 1}',
        '{"ID": 3, "Name": "c", "amount": 3}',
        '{"id": 4, "ID": 5, "name": "d", "amount": 4}',
        '{"id": 6, "name": "e", "NAME": null, "amount": 6}',
    ]
    drops.write("e1.jsonl", "\n".join(lines) + "\n", 1_700_000_000)
    drops.catalog(path="*.jsonl", primary_key="id")
    drops.run()
    assert drops.rows() == [(1, "a", 1), (3, "c", 3), (6, "e", 6)]
    ((key, error),) = drops.dead_letters()
    assert key == "e1.jsonl:line3"
    assert "['id', 'ID']" in error


def test_a_renamed_file_parks_its_bad_lines_once_under_its_new_name(tmp_path: Path) -> None:
    drops = Drops(tmp_path)
    old = drops.write("e1.jsonl", '{"id": 1, "name": "a", "amount": 1}\nnot json\n{"id": null}\n', 1_700_000_000)
    drops.write("keep.jsonl", '{"id": 9, "name": "k", "amount": 9}\n[1]\n', 1_700_000_050)  # not moved: kept
    drops.catalog(path="*.jsonl", primary_key="id")
    drops.run()
    assert [k for k, _ in drops.dead_letters()] == ["e1.jsonl:line2", "e1.jsonl:line3", "keep.jsonl:line2"]
    old.rename(old.with_name("e1b.jsonl"))  # keeps its modified time
    drops.run()
    assert [k for k, _ in drops.dead_letters()] == ["e1b.jsonl:line2", "e1b.jsonl:line3", "keep.jsonl:line2"]
    assert drops.rows() == [(1, "a", 1), (9, "k", 9)]


def test_a_csv_row_parked_by_its_number_says_its_line(tmp_path: Path) -> None:
    drops = Drops(tmp_path)
    # records: 1 (two lines), the blank line none, 2 (short: its number kept), 3 on line 6, 4 on line 7
    text = 'id,name,amount\n1,"two\nlines",1\n\n2,short\n3,x,oops\n,nokey,4\n'
    drops.write("a.csv", text, 1_700_000_000)
    drops.catalog(path="*.csv", primary_key="id", csv={"column_types": {"amount": "int64"}})
    drops.run()
    with duckdb.connect(str(drops.warehouse), read_only=True) as con:
        parked = con.sql("SELECT record_key, position, error FROM drops._ingest_dead_letter ORDER BY 1").fetchall()
    found = {key: (json.loads(position)["line"], error) for key, position, error in parked}
    assert {key: line for key, (line, _) in found.items()} == {"a.csv:line5": 5, "a.csv:row3": 6, "a.csv:row4": 7}
    assert found["a.csv:row3"][1].startswith("file a.csv row 3 (line 6): column 'amount'")
    assert drops.rows() == [(1, "two\nlines", 1)]


def test_a_quote_never_closed_in_the_first_row_parks_the_rows_it_swallowed(tmp_path: Path) -> None:
    """pyarrow gives no batch at all for such a file, only a row of the wrong width: it was read as 0 rows."""
    drops = Drops(tmp_path)
    drops.write("f3.csv", 'id,name,amount\n5,"a\n', 1_700_000_000)
    drops.write("f4.csv", 'id,name\n"5,a\n6,b\n', 1_700_000_010)
    drops.write("f5.tsv", 'id\tname\tamount\n5\t"never closed\tx\n6\ty\tz\n', 1_700_000_020)
    drops.write("f6.csv", 'id,name,amount\r\n5,"a\r\n6,b,1\r\n7,c,2\r\n8,d,3\r\n', 1_700_000_030)
    drops.write("f0.csv", "id,name,amount\n1,x,2\n", 1_700_000_040)
    drops.catalog(path="f*", primary_key="id", csv={"quote_char": '"'})  # a .tsv file quotes only if told
    outcome = drops.run()
    assert outcome.result.dead_letters == 4
    with duckdb.connect(str(drops.warehouse), read_only=True) as con:
        parked = con.sql("SELECT record_key, position, error FROM drops._ingest_dead_letter ORDER BY 1").fetchall()
    assert [(key, json.loads(position)["line"]) for key, position, _ in parked] == [
        ("f3.csv:line2", 2),
        ("f4.csv:line2", 2),
        ("f5.tsv:line2", 2),
        ("f6.csv:line2", 2),
    ]
    assert all("never closed" in error for _, _, error in parked[1:])
    assert "2 fields where the header has 3" in parked[0][2]
    assert "4 lines" in parked[3][2]
    drops.run()  # the files read before are not due again; their dead letters stay
    assert drops.rows() == [(1, "x", 2)]
    assert len(drops.dead_letters()) == 4


def test_a_header_whose_quote_is_never_closed_parks_the_file(tmp_path: Path) -> None:
    """Found by a third attacker: the header swallowed every line, the file read as nothing and passed silently."""
    drops = Drops(tmp_path)
    drops.write("h.csv", '"id,name,v\n1,a,10\n2,b,20\n', 1_700_000_000)
    drops.write("ok.csv", "id,name,v\n3,c,30\n", 1_700_000_010)
    drops.catalog(path="*.csv", primary_key="id")
    outcome = drops.run()
    assert drops.rows("id, name") == [(3, "c")]
    ((key, error),) = drops.dead_letters()
    assert key.startswith("h.csv") and "never closed" in error
    assert outcome.result.dead_letters == 1


def test_a_quote_that_closes_mid_field_lines_later_parks_the_file_instead_of_swallowing_rows(tmp_path: Path) -> None:
    """Found by a third attacker: rows 3-5 vanished into row 2's value, a row of the right width, no dead letter."""
    drops = Drops(tmp_path)
    drops.write("m.csv", 'id,name,amount\n1,a,10\n2,b,"20\n3,c,30\n4,d,40\n5,e,"50\n6,f,60\n', 1_700_000_000)
    drops.write("ok.csv", 'id,name,amount\n7,"two\nlines",1\n8,"ab"c,2\n', 1_700_000_010)  # one line: read leniently
    drops.catalog(path="*.csv", primary_key="id")
    outcome = drops.run()
    assert drops.rows("id, name") == [(7, "two\nlines"), (8, "abc")]
    ((key, error),) = drops.dead_letters()
    assert key == "m.csv:file" and "line 3" in error and "line 6" in error
    assert outcome.result.dead_letters == 1
