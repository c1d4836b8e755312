"""JSON lines: one JSON string lands as one text whatever else its batch holds (a string met an object in the same
field and landed quoted, `"ok"`, beside the `ok` of other batches), and lines end at CR LF, LF or a CR alone (a
file of CR-only line ends read as one bad line; mixed line ends joined records), on DuckDB and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from ingestion_assets_tests.files_helpers import Drops, Target, target, target_catalog

__all__ = ["target"]  # the fixture: each test once on DuckDB, once on PostgreSQL

BASE = 1_700_000_000.0
CHUNK = 1 << 20  # the JSON lines reader's read size


def test_a_string_lands_as_its_text_whether_or_not_its_batch_holds_an_object(target: Target) -> None:
    """Found by an attacker: run 1 loaded `"ok"` as ok; run 2's batch held `"ok"` and `{"x": 1}` in the same field
    and loaded the string as its JSON text, `"ok"` with the quotes. A string is its text in every batch; objects,
    arrays, numbers and booleans among strings are their JSON text."""
    target_catalog(target, "*.jsonl")
    target.drops.write("a.jsonl", '{"id": 1, "v": "ok"}\n{"id": 2, "v": "a\\"b"}\n', BASE + 1)
    first = target.drops.run()
    target.drops.write(
        "b.jsonl",
        '{"id": 3, "v": "ok"}\n{"id": 4, "v": {"x": 1}}\n{"id": 5, "v": "a\\"b"}\n{"id": 6, "v": [1, "s"]}\n'
        '{"id": 7, "v": 1.50}\n{"id": 8, "v": true}\n{"id": 9, "v": null}\n{"id": 10, "v": "null"}\n'
        '{"id": 11, "v": "{\\"x\\": 1}"}\n{"id": 12, "v": ""}\n',
        BASE + 2,
    )
    second = target.drops.run()
    assert target.query("SELECT id, v FROM drops.orders ORDER BY id") == [
        (1, "ok"),
        (2, 'a"b'),
        (3, "ok"),
        (4, '{"x": 1}'),
        (5, 'a"b'),
        (6, '[1, "s"]'),
        (7, "1.50"),
        (8, "true"),
        (9, None),
        (10, "null"),
        (11, '{"x": 1}'),  # a string holding JSON is that text, as a string holding `1` is `1`
        (12, ""),
    ]
    assert first.result.dead_letters == second.result.dead_letters == 0


def test_a_string_among_objects_in_the_first_batch_is_its_text(target: Target) -> None:
    """The same in one file's only batch, and in a batch after one of strings only (`batch_rows: 2`)."""
    target_catalog(target, "*.jsonl", batch_rows=2)
    lines = ['{"id": 1, "v": {"a": [1]}}', '{"id": 2, "v": "x"}', '{"id": 3, "v": "y"}', '{"id": 4, "v": "z"}']
    lines += ['{"id": 5, "v": "w"}', '{"id": 6, "v": [2]}']
    target.drops.write("a.jsonl", "\n".join(lines) + "\n", BASE + 1)
    target.drops.run()
    assert target.query("SELECT id, v FROM drops.orders ORDER BY id") == [
        (1, '{"a": [1]}'),
        (2, "x"),
        (3, "y"),
        (4, "z"),
        (5, "w"),
        (6, "[2]"),
    ]


def test_json_lines_end_at_cr_lf_lf_or_a_lone_cr_with_their_line_numbers(target: Target) -> None:
    """Found by an attacker: lines separated by a CR alone were read as one line (one dead letter "Extra data"),
    and a file of mixed line ends joined the records around each lone CR. A raw CR cannot be inside a JSON
    value (JSON escapes it), so it ends a line as CR LF and LF do; each counts one line, as in CSV files."""
    target_catalog(target, "*.jsonl", primary_key=[])
    target.drops.write("mac.jsonl", '{"id": 1}\r{"id": 2}\roops\r\r{"id": 5, "v": "a\\rb"}\r', BASE + 1)
    mixed = '{"id": 6}\r\n{"id": 7}\r{"id": 8}\n{"id": 9}\r\r\n{"id": 10}\n\r{"id": 11}\r[1]\n{"id": 12}'
    target.drops.write("mixed.jsonl", mixed, BASE + 2)
    outcome = target.drops.run()
    rows = target.query("SELECT _ingest_file, _ingest_file_row, id, v FROM drops.orders ORDER BY 1, 2")
    assert rows == [
        ("mac.jsonl", 1, 1, None),
        ("mac.jsonl", 2, 2, None),
        ("mac.jsonl", 5, 5, "a\rb"),  # the escaped CR inside the value is the value's
        ("mixed.jsonl", 1, 6, None),
        ("mixed.jsonl", 2, 7, None),
        ("mixed.jsonl", 3, 8, None),
        ("mixed.jsonl", 4, 9, None),
        ("mixed.jsonl", 6, 10, None),  # line 5 is the empty line between `\r` and `\r\n`
        ("mixed.jsonl", 8, 11, None),  # line 7 the empty one between `\n` and `\r`
        ("mixed.jsonl", 10, 12, None),
    ]
    assert outcome.result.dead_letters == 2
    dead = dict(target.dead_letters())
    assert sorted(dead) == ["mac.jsonl:line3", "mixed.jsonl:line9"]
    assert dead["mac.jsonl:line3"].startswith("file mac.jsonl line 3: not JSON")
    assert dead["mixed.jsonl:line9"].startswith("file mixed.jsonl line 9: a JSON list, not an object")


def test_line_ends_split_across_reads_count_once(tmp_path: Path) -> None:
    """A CR LF whose CR ends one read of the file and whose LF starts the next is one line end, not two (an empty
    line between would shift every later line number, the row key of a keyless stream); a lone CR ending a read
    ends its line."""
    drops = Drops(tmp_path)
    drops.catalog(path="*.jsonl")

    def padded(id_: int, length: int) -> str:
        return f'{{"id": {id_}, "pad": "' + "p" * (length - 20) + '"}'  # 18 characters before the pad, 2 after

    first = padded(1, CHUNK - 1)  # its CR is the first read's last byte, its LF the second's first
    second = padded(2, CHUNK - 2)  # its lone CR is the second read's last byte
    text = first + "\r\n" + second + "\r" + '{"id": 3}\n' + "oops\r" + '{"id": 5}'
    assert text[CHUNK - 1 : CHUNK + 1] == "\r\n" and text[2 * CHUNK - 1] == "\r"
    drops.write("a.jsonl", text, BASE + 1)
    outcome = drops.run()
    assert drops.rows("_ingest_file_row, id, length(pad)") == [
        (1, 1, CHUNK - 21),
        (2, 2, CHUNK - 22),
        (3, 3, None),
        (5, 5, None),
    ]
    assert outcome.result.dead_letters == 1
    assert [key for key, _ in drops.dead_letters()] == ["a.jsonl:line4"]


def test_a_field_without_a_name_parks_its_line_and_the_stream_goes_on(tmp_path: Path) -> None:
    """Found by an attacker: a line `{"id":1,"":5}` failed the whole stream with a bare `ValueError` (no file, line
    or field), and every later file was stuck behind it. Now that line is parked naming file, line and field, its
    neighbours and the later file load; a nameless field holding null is dropped, as a CSV's unnamed column is."""
    drops = Drops(tmp_path)
    drops.catalog(path="*.jsonl", primary_key="id")
    drops.write("a.jsonl", '{"id":1,"v":"a"}\n{"id":2,"":5,"x y":1}\n{"id":3," ":null,"v":"c"}\n', BASE)
    drops.write("b.jsonl", '{"id":4,"v":"d"}\n', BASE + 1)
    outcome = drops.run()
    assert drops.rows("id, v") == [(1, "a"), (3, "c"), (4, "d")]
    ((key, error),) = drops.dead_letters()
    assert key == "a.jsonl:line2" and outcome.result.dead_letters == 1
    assert error.startswith("file a.jsonl line 2: the field '' has no name") and "holds 5" in error
