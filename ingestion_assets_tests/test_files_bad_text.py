"""Bad text parks its row (or its file) and never blocks the stream: a NUL character (PostgreSQL's text cannot hold
it, DuckDB's does), CR-only line ends, fragments of rows cut by a stray CR, a lone surrogate escape or a key written
twice in a JSON line, a file that is one unclosed quote. Each bad row is its own dead letter, named by file and
line."""

from __future__ import annotations

import json

import pytest

from ingestion_assets.sync import FAULT_ENV, InjectedFault
from ingestion_assets_tests.files_helpers import Target, target, target_catalog

__all__ = ["target"]  # the fixture: each test once on DuckDB, once on PostgreSQL

BASE = 1_700_000_000.0


def test_a_nul_in_text_parks_its_row_on_postgres_and_loads_as_written_on_duckdb(target: Target) -> None:
    """PostgreSQL's COPY refused the slice ('invalid byte sequence for encoding "UTF8": 0x00') naming neither file
    nor row, and every run failed the same way. Now the row is parked naming file, line and column; DuckDB holds
    the NUL and reads it back as written, so there it loads."""
    target_catalog(target, "*")
    rows = "".join(f"{i},n{i}\n" if i != 500 else f"{i},x\x00y\n" for i in range(1, 1001))
    target.drops.write("a.csv", "id,name\n" + rows, BASE + 1)
    target.drops.write("b.csv", 'id,name\n"20\x00",a\n2001,"q\x00\nr"\n2002,b\n', BASE + 2)  # a key, a value on 2 lines
    target.drops.write("c.jsonl", '{"id": 3001, "name": "d"}\n{"id": 3002, "name": "e\\u0000f"}\n', BASE + 3)
    outcome = target.drops.run()
    loaded = dict(target.query("SELECT CAST(id AS TEXT), name FROM drops.orders"))
    if target.url is None:  # DuckDB
        assert outcome.result.dead_letters == 0
        assert (loaded["500"], loaded["20\x00"], loaded["2001"], loaded["3002"]) == (
            "x\x00y",
            "a",
            "q\x00\nr",
            "e\x00f",
        )
        assert len(loaded) == 1005
        return
    assert outcome.result.dead_letters == 4
    assert len(loaded) == 1001 and {"1", "999", "1000", "2002", "3001"} <= set(loaded)
    dead = dict(target.dead_letters())
    assert sorted(dead) == ["a.csv:row500", "b.csv:row1", "b.csv:row2", "c.jsonl:line2"]
    assert dead["a.csv:row500"].startswith("file a.csv row 500 (line 501): column 'name' holds the NUL character")
    assert "which PostgreSQL cannot store in text" in dead["a.csv:row500"]
    assert dead["b.csv:row1"].startswith("file b.csv row 1 (line 2): column 'id' holds the NUL")
    assert dead["b.csv:row2"].startswith("file b.csv row 2 (line 3): column 'name' holds the NUL")
    assert dead["c.jsonl:line2"].startswith("file c.jsonl line 2: column 'name' holds the NUL")
    ((raw,),) = target.query("SELECT raw_record FROM drops._ingest_dead_letter WHERE record_key = 'c.jsonl:line2'")
    raw = raw if isinstance(raw, dict) else json.loads(raw)
    assert json.loads(raw["text"]) == {"id": 3002, "name": "e\x00f"}  # the value as read, NUL written \u0000


def test_csv_with_cr_only_line_ends_reads_its_rows_and_lines(target: Target) -> None:
    """A file of old Mac line ends (a CR alone) failed the stream: its header was read up to the first LF (the
    whole file) and Python's csv refused the CRs in it. pyarrow ends lines at a CR, so the file reads; bad rows
    in it are named by their line, counted as pyarrow and Python's csv count them (CR LF, LF, CR: one each)."""
    target_catalog(target, "*", csv={"column_types": {"amount": "float64"}})
    target.drops.write("mac.csv", "id,name,amount\r1,a,1.5\r2,b,oops\r3,c,2\r4,d\r", BASE + 1)
    target.drops.write("mixed.csv", "id,name,amount\r\n5,e,1\r6,f,2\n7,g,x\r\n8,h,3", BASE + 2)
    outcome = target.drops.run()
    assert sorted(r[0] for r in target.query("SELECT id FROM drops.orders")) == [1, 3, 5, 6, 8]
    assert outcome.result.dead_letters == 3
    dead = dict(target.dead_letters())
    assert sorted(dead) == ["mac.csv:line5", "mac.csv:row2", "mixed.csv:row3"]
    assert dead["mac.csv:row2"].startswith("file mac.csv row 2 (line 3): column 'amount'")
    assert dead["mixed.csv:row3"].startswith("file mixed.csv row 3 (line 4): column 'amount'")
    assert dead["mac.csv:line5"].startswith("file mac.csv line 5: ")


def test_fragments_of_rows_cut_by_a_stray_cr_are_each_their_own_dead_letter(target: Target) -> None:
    """A CR inside an unquoted value ends the line there (as in pyarrow, Python's csv and editors): the piece after
    it is a row of the wrong width. Such fragments were keyed by their text, so two fragments reading alike left
    one dead letter (the reader's line finder, counting LF only, could not place them). Each is now parked by its
    line; the value before the CR loads as what it is (`cut`), the fragment's dead letter says where the rest is."""
    target_catalog(target, "*")
    target.drops.write("a.csv", "id,name,note\n1,a,x\n2,b,cut\rhere\n3,c,y\n4,d,cut\rhere\n5,e,z\n", BASE + 1)
    outcome = target.drops.run()
    assert sorted(target.query("SELECT id, note FROM drops.orders")) == [
        (1, "x"),
        (2, "cut"),
        (3, "y"),
        (4, "cut"),
        (5, "z"),
    ]
    assert outcome.result.dead_letters == 2
    dead = dict(target.dead_letters())
    assert sorted(dead) == ["a.csv:line4", "a.csv:line7"]
    assert all(error.startswith(f"file a.csv {key[6:10]} {key[10:]}: ") for key, error in dead.items())


def test_json_lines_with_a_lone_surrogate_or_a_key_twice_park_their_row(target: Target) -> None:
    """`"\\ud800"` (half a surrogate pair) parsed into a Python string Arrow cannot encode and failed the stream;
    `{"v": 1, "v": 2}` kept the last value without a word. Both are parked naming what is wrong; a whole pair
    (an emoji written as two escapes) loads."""
    target_catalog(target, "*")
    lines = [
        '{"id": 1, "name": "a"}',
        '{"id": 2, "name": "b\\ud800c"}',
        '{"id": 3, "name": "smile \\ud83d\\ude00"}',
        '{"id": 4, "n\\udfffame": "d"}',
        '{"id": 5, "name": "e", "name": "E"}',
        '{"id": 6, "o": {"k": 1, "k": 2}}',
        '{"id": 7, "name": "\\\\ud800 as text"}',
    ]
    target.drops.write("a.jsonl", "\n".join(lines) + "\n", BASE + 1)
    outcome = target.drops.run()
    loaded = dict(target.query("SELECT id, name FROM drops.orders"))
    assert loaded == {1: "a", 3: "smile \U0001f600", 7: "\\ud800 as text"}
    assert outcome.result.dead_letters == 4
    dead = dict(target.dead_letters())
    assert sorted(dead) == ["a.jsonl:line2", "a.jsonl:line4", "a.jsonl:line5", "a.jsonl:line6"]
    assert "invalid text: the value of 'name' holds the escape \\ud800" in dead["a.jsonl:line2"]
    assert "invalid text: the key 'n\\udfffame' holds the escape \\udfff" in dead["a.jsonl:line4"]
    assert "the key 'name' appears twice in one object" in dead["a.jsonl:line5"]
    assert "the key 'k' appears twice in one object" in dead["a.jsonl:line6"]


def test_a_file_of_one_unclosed_quote_is_parked_not_read_as_empty(target: Target) -> None:
    """A file holding only `"` (or a header line whose quote never closes) read as an empty file, nothing said."""
    target_catalog(target, "*")
    target.drops.write("q.csv", '"', BASE + 1)
    target.drops.write("h.csv", 'id,"name\n', BASE + 2)
    target.drops.write("closed.csv", '"id"x,name\n', BASE + 3)  # a mid-field quote swallows nothing: no rows
    target.drops.write("ok.csv", "id,name\n1,a\n", BASE + 4)
    outcome = target.drops.run()
    assert sorted(r[0] for r in target.query("SELECT id FROM drops.orders")) == [1]
    assert outcome.result.dead_letters == 2
    dead = dict(target.dead_letters())
    assert sorted(dead) == ["h.csv:file", "q.csv:file"]
    assert "its only line (line 1) opens a quote that is never closed" in dead["q.csv:file"]


def test_csv_slices_hold_at_most_slice_rows_and_resume_inside_a_block(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CSV file is read in 4 MB blocks (~300k short rows each) and a slice took whole blocks: `slice_rows: 1000`
    gave slices of 294,433 rows. A block is now cut at the slice's room; a run stopped after a slice cut inside a
    block resumes inside it: every row lands once, each bad row is parked once (rows of the wrong width are counted
    apart from the rows, bad values by their row)."""
    target_catalog(target, "*.csv", slice_rows=1000, csv={"column_types": {"amount": "float64"}})
    lines = [f"{i},n{i},{i}.5" if i not in (1500, 3500) else f"{i},short" for i in range(1, 5001)]
    lines[2499] = "2500,bad,oops"
    target.drops.write("a.csv", "id,name,amount\n" + "\n".join(lines) + "\n", BASE + 1)
    monkeypatch.setenv(FAULT_ENV, "after_checkpoint:2")
    with pytest.raises(InjectedFault):
        target.drops.run()
    partial = target.drops.store.latest(None).position["partial"]  # type: ignore[union-attr]
    # three slices of 1000 rows (row 2500 parked): up to record 3002, the short record 1500 counted
    assert partial["path"] == "a.csv" and partial["rows"] == 3002
    monkeypatch.delenv(FAULT_ENV)
    outcome = target.drops.run()
    assert outcome.result.rows == 4998 - 3001 and outcome.result.slices <= 3  # the rest, in slices of 1000
    ids = [r[0] for r in target.query("SELECT id FROM drops.orders ORDER BY id")]
    assert ids == [i for i in range(1, 5001) if i not in (1500, 2500, 3500)]
    assert sorted(dict(target.dead_letters())) == ["a.csv:line1501", "a.csv:line3501", "a.csv:row2500"]
