"""CSV files read in blocks: a quoted value whose line break falls where a block is cut is still one value. A third
attacker's valid 52 MB file with many such values was parked ("CSV parser got out of sync with chunker"); a fourth
one's value whose lines looked like rows became rows: keys of another file overwritten, no dead letter."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from ingestion_assets_tests.files_helpers import Drops


def test_quoted_line_breaks_across_read_blocks_are_read_as_values(tmp_path: Path) -> None:
    drops = Drops(tmp_path)
    rows = [(i, f"first {i}\nsecond {i}" if i % 3 == 0 else f"plain {i}", i) for i in range(1, 3001)]
    drops.write("a.csv", _quoted(rows), 1_700_000_000)
    drops.write("b.csv", _quoted([(5000, "after", 1)]), 1_700_000_100)
    drops.catalog(path="*.csv", primary_key="id", csv={"max_row_bytes": 2048})  # blocks of 2 KB: many cuts
    outcome = drops.run()
    assert drops.rows() == [*rows, (5000, "after", 1)]
    assert outcome.result.dead_letters == 0


def test_the_lines_of_a_quoted_value_across_a_block_cut_never_become_rows(tmp_path: Path) -> None:
    drops = Drops(tmp_path)
    earlier = [(i, f"real {i}", i) for i in range(1, 11)]
    drops.write("a.csv", _quoted(earlier), 1_700_000_000)
    later = [
        (i, f"note:\n{i % 10 + 1},EVIL,0\nthanks, Bob" if i % 7 == 0 else f"plain {i}", i) for i in range(100, 1100)
    ]
    drops.write("b.csv", _quoted(later), 1_700_000_100)
    drops.catalog(path="*.csv", primary_key="id", csv={"max_row_bytes": 2048})  # blocks of 2 KB: many cuts
    outcome = drops.run()
    assert drops.rows() == [*earlier, *later]
    assert outcome.result.dead_letters == 0


def _quoted(rows: list[tuple[int, str, int]]) -> str:
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows([("id", "name", "amount"), *rows])
    return text.getvalue()


def test_a_quote_never_closed_on_a_last_line_without_a_line_break_is_parked(tmp_path: Path) -> None:
    """Found by a fifth attacker: `2,b,"cut short<EOF>` loaded `cut short` as a whole value, `"11<EOF>` as key 11."""
    drops = Drops(tmp_path)
    drops.write("a.csv", 'id,name,amount\n1,a,10\n2,b,"20', 1_700_000_000)
    drops.write("b.csv", 'name,amount,id\nc,30,3\nd,40,"4', 1_700_000_100)
    drops.write("c.csv", 'id,name,amount\n5,"e",50\n6,f,"60"', 1_700_000_200)  # closed, no line break: read
    drops.write("d.csv", 'id,name,amount\n7,"g\nh",70\n8,i,"80', 1_700_000_300)
    drops.catalog(path="*.csv", primary_key="id")
    outcome = drops.run()
    assert drops.rows() == [(1, "a", 10), (3, "c", 30), (5, "e", 50), (6, "f", 60), (7, "g\nh", 70)]
    assert sorted(key for key, _ in drops.dead_letters()) == ["a.csv:row2", "b.csv:row2", "d.csv:row2"]
    assert all("never closed" in error for _, error in drops.dead_letters())
    assert outcome.result.dead_letters == 3


def test_a_header_naming_a_column_twice_parks_its_file_and_the_stream_goes_on(tmp_path: Path) -> None:
    """Found by a fifth attacker: pyarrow's 'Field "v" exists 2 times in schema' failed the whole stream."""
    drops = Drops(tmp_path)
    drops.write("a.csv", "id,name,name\n1,a,b\n", 1_700_000_000)
    drops.write("b.csv", "id,name,amount\n2,c,3\n", 1_700_000_100)
    drops.catalog(path="*.csv", primary_key="id")
    outcome = drops.run()
    assert drops.rows() == [(2, "c", 3)]
    ((key, error),) = drops.dead_letters()
    assert key == "a.csv:file" and "'name' more than once" in error
    assert outcome.result.dead_letters == 1


def test_a_quote_never_closed_is_parked_also_when_its_value_holds_a_doubled_or_escaped_quote(tmp_path: Path) -> None:
    """Found by a sixth attacker: `2,"x""y` then lines to the end of the file loaded as one value (`x"y\\n3,c...`),
    the rows after it lost, since the check compared the file's end with the value as read (one quote, not two)."""
    drops = Drops(tmp_path)
    drops.write("a.csv", 'id,name,amount\n1,a,1\n2,b,"x""y\n3,c,3\n4,d,4\n', 1_700_000_000)
    drops.write("b.csv", 'id,name,amount\n5,e,"ok"""\n6,f,"6"', 1_700_000_100)  # closed, ending in a quote: read
    drops.catalog(path="*.csv", primary_key="id", csv={"column_types": {"amount": "string"}})
    outcome = drops.run()
    assert drops.rows() == [(1, "a", "1"), (5, "e", 'ok"'), (6, "f", "6")]
    assert [key for key, _ in drops.dead_letters()] == ["a.csv:row2"]
    escaped = Drops(tmp_path / "escaped")
    escaped.write("a.csv", 'id,name,amount\n1,a,1\n2,b,"ab\\"\n3,c,3\n', 1_700_000_000)
    escaped.catalog(path="*.csv", primary_key="id", csv={"escape_char": "\\", "column_types": {"amount": "string"}})
    escaped.run()
    assert escaped.rows() == [(1, "a", "1")]
    assert [key for key, _ in escaped.dead_letters()] == ["a.csv:row2"]
    assert outcome.result.dead_letters == 1


def test_with_an_escape_character_a_quote_never_closed_is_parked_whatever_it_escapes(tmp_path: Path) -> None:
    """Found by a seventh attacker: `2,"x\\n\\a\\n3,b` (an escaped ordinary character loses its escape in the value)
    loaded rows 3 and on inside row 2's value. A file with an escape character is scanned for a quote left open."""
    drops = Drops(tmp_path)
    drops.write("a.csv", 'id,name,amount\n1,a,1\n2,b,"x\n\\a\n3,c,3\n', 1_700_000_000)
    drops.write("b.csv", 'id,name,amount\n4,d,"x\\\ny\n5,e,5\n6,f,6', 1_700_000_100)  # an escaped line break
    drops.write("c.csv", 'id,name,amount\n7,g,"a\nb\\"c"\n8,h,"i\\\\"', 1_700_000_200)  # closed: read
    options = {"escape_char": "\\", "column_types": {"amount": "string"}}
    drops.catalog(path="*.csv", primary_key="id", csv=options)
    outcome = drops.run()
    assert drops.rows() == [(1, "a", "1"), (7, "g", 'a\nb"c'), (8, "h", "i\\")]
    assert sorted(key for key, _ in drops.dead_letters()) == ["a.csv:row2", "b.csv:row1"]
    assert outcome.result.dead_letters == 2
