"""Files source on a local folder: drops read incrementally by file, rewrites and late files, bad rows and
broken files parked, schema drift through the policy; the target compared with the files row by row."""

from __future__ import annotations

import gzip
import io
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ingestion_assets.sources.files.csv as csv_reader
from ingestion_assets.catalog.files import CsvOptions
from ingestion_assets.sources.files import Resume
from ingestion_assets.streams.runner import PartitionJob
from ingestion_assets.streams.schema_step import SchemaPaused
from ingestion_assets_tests.files_helpers import Drops, csv_text

BASE = 1_700_000_000.0  # the drops' modified times, chosen by the tests


def _parquet(rows: list[tuple[Any, ...]], row_group_size: int = 1000) -> bytes:
    table = pa.table({"id": [r[0] for r in rows], "name": [r[1] for r in rows], "amount": [r[2] for r in rows]})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=row_group_size)
    return buffer.getvalue()


def _jsonl(rows: list[tuple[Any, ...]]) -> str:
    import json

    return "".join(json.dumps({"id": r[0], "name": r[1], "amount": r[2]}) + "\n" for r in rows)


def _rows(first: int, count: int, tag: str = "v1") -> list[tuple[Any, ...]]:
    return [(i, f"{tag}-{i}", round(i * 1.25, 2)) for i in range(first, first + count)]


@pytest.fixture
def drops(tmp_path: Path) -> Drops:
    return Drops(tmp_path)


@pytest.mark.slow  # several loads (or a subprocess): beyond the default suite's time budget
def test_drops_in_every_format_load_incrementally_and_equal_the_files(drops: Drops) -> None:
    drops.catalog(path="**/*", primary_key="id", files_per_slice=2)
    expected: dict[int, tuple[Any, ...]] = {}
    for round_ in range(3):
        start = round_ * 300
        batches = [_rows(start + k * 60, 60) for k in range(5)]
        drops.write(f"r{round_}/a.csv", csv_text(batches[0]), BASE + round_ * 100 + 1)
        drops.write(f"r{round_}/b.csv.gz", gzip.compress(csv_text(batches[1]).encode()), BASE + round_ * 100 + 2)
        drops.write(f"r{round_}/c.jsonl", _jsonl(batches[2]), BASE + round_ * 100 + 3)
        drops.write(f"r{round_}/d.parquet", _parquet(batches[3], 17), BASE + round_ * 100 + 4)
        drops.write(f"r{round_}/e.csv.zst", _zstd(csv_text(batches[4]).encode()), BASE + round_ * 100 + 5)
        expected.update({r[0]: r for batch in batches for r in batch})
        outcome = drops.run()
        assert outcome.result.rows == 300  # this round's files only
        assert drops.rows() == sorted(expected.values())
    assert drops.run().result.rows == 0  # nothing new: nothing read
    position = drops.store.latest(None).position  # type: ignore[union-attr]
    assert (position["path"], position["partial"]) == ("r2/e.csv.zst", None)


def _zstd(data: bytes) -> bytes:
    buffer = pa.BufferOutputStream()
    with pa.CompressedOutputStream(buffer, "zstd") as stream:
        stream.write(data)
    return bytes(buffer.getvalue().to_pybytes())


def test_a_file_rewritten_in_place_is_read_again_and_merged_by_key(drops: Drops) -> None:
    drops.catalog(path="*.csv", primary_key="id")
    drops.write("a.csv", csv_text(_rows(1, 50)), BASE)
    drops.write("b.csv", csv_text(_rows(51, 50)), BASE + 10)
    drops.run()
    changed = _rows(1, 50, tag="v2") + _rows(101, 5, tag="v2")
    drops.write("a.csv", csv_text(changed), BASE)  # same modified time (a copy that keeps it): size differs
    assert drops.run().result.rows == 55
    assert drops.rows() == sorted(changed + _rows(51, 50))


def test_a_late_file_with_an_older_time_is_read_within_the_lookback(drops: Drops) -> None:
    drops.catalog(path="*.csv", primary_key="id", lookback_seconds=3600)
    drops.write("b.csv", csv_text(_rows(1, 10)), BASE + 1000)
    drops.run()
    drops.write("a_late.csv", csv_text(_rows(11, 10)), BASE + 10)  # copied in later, keeping an older time
    assert drops.run().result.rows == 10
    assert drops.rows() == sorted(_rows(1, 20))


def test_a_file_older_than_the_lookback_that_nothing_knows_is_read_and_said(
    drops: Drops, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by the files attack: a new path with a modified time older than the lookback window (`cp -p`,
    `rsync -t`, `mv`) was taken as read, silently. Which files were read is now known exactly (the checkpoint's
    fingerprints, the target's `_ingest_file`), so such a file is read, and the run says so."""
    import logging

    drops.catalog(path="*.csv", primary_key="id", lookback_seconds=3600)
    drops.write("b.csv", csv_text(_rows(1, 10)), BASE + 1000)
    drops.write("old.csv", csv_text(_rows(31, 5)), BASE - 9000)
    drops.run()
    drops.write("c.csv", csv_text(_rows(11, 5)), BASE + 9000)  # the window moves: b.csv and old.csv leave it
    drops.run()
    drops.write("ancient.csv", csv_text(_rows(21, 10)), BASE - 7200)  # copied in keeping an old time
    job = PartitionJob(drops.stream(), drops.store, run_id="test", log=logging.getLogger("files-test"))
    with caplog.at_level(logging.WARNING, logger="files-test"):
        outcome = job.run()
    assert outcome.result.rows == 10  # ancient.csv only: b.csv and old.csv are known by the rows the target holds
    figures = outcome.result.figures
    assert (figures["files_read_unknown_old"], figures["files_read_unknown_old_examples"]) == (1, "ancient.csv")
    assert "drops.orders: 1 file(s) older than the lookback window" in caplog.text and "ancient.csv" in caplog.text
    assert drops.rows() == sorted(_rows(1, 15) + _rows(21, 10) + _rows(31, 5))
    assert drops.run().result.rows == 0  # read once: known from now on


def test_a_file_with_a_future_modified_time_hides_no_later_rewrite(
    drops: Drops, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by the README-only attack: the lookback window was anchored on the newest modified time read, so a
    file stamped two days ahead moved it past now, and a.csv rewritten now counted as older than the window with
    its rows in the target: never read again, status ok. The window is anchored at most at the run's clock, and
    the run names the file from the future."""
    import logging

    drops.catalog(path="*.csv", primary_key="id")  # the default lookback: one day
    now = time.time()
    drops.write("a.csv", "id,name\n1,a\n", now - 60)
    drops.run()
    drops.write("z.csv", "id,name\n9,future\n", now + 2 * 86400)
    drops.run()
    drops.write("a.csv", "id,name\n1,a-rewritten\n2,new\n")
    drops.write("b.csv", "id,name\n3,b\n")
    job = PartitionJob(drops.stream(), drops.store, run_id="test", log=logging.getLogger("files-test"))
    with caplog.at_level(logging.WARNING, logger="files-test"):
        outcome = job.run()
    assert drops.rows("id, name") == [(1, "a-rewritten"), (2, "new"), (3, "b"), (9, "future")]
    assert outcome.result.figures["files_modified_in_future_examples"] == "z.csv"
    assert "z.csv" in caplog.text and "in the future" in caplog.text


def test_files_of_the_same_modified_time_sharing_a_key_are_named(
    drops: Drops, caplog: pytest.LogCaptureFixture
) -> None:
    """S3 keeps modified times in whole seconds: two uploads in one second carrying the same key are ordered by
    path, not by upload order, and the merge kept one value with no word (found by the README-only attack). Which
    is newer cannot be known: the run names the files and a key in a warning and its figures. Files of the same
    time with other keys, and files of other times, are not named."""
    import logging

    drops.catalog(path="*.csv", primary_key="id", files_per_slice=2)
    drops.write("b.csv", "id,name\n1,uploaded-first\n2,b\n", BASE + 1)
    drops.write("a.csv", "id,name\n1,uploaded-second\n", BASE + 1)  # same second: ordered after b.csv by path
    drops.write("c.csv", "id,name\n3,c\n", BASE + 1)  # same second, no shared key
    drops.write("d.csv", "id,name\n2,d\n", BASE + 2)  # a later second: newer by its time, no doubt
    job = PartitionJob(drops.stream(), drops.store, run_id="test", log=logging.getLogger("files-test"))
    with caplog.at_level(logging.WARNING, logger="files-test"):
        outcome = job.run()
    assert drops.rows("id, name") == [(1, "uploaded-first"), (2, "d"), (3, "c")]
    assert outcome.result.figures["files_same_modified_time_keys"] == 1
    assert outcome.result.figures["files_same_modified_time_keys_examples"] == "a.csv and b.csv (key id=1)"
    assert "drops.orders" in caplog.text and "a.csv and b.csv (key id=1)" in caplog.text


def test_old_snapshots_whose_keys_all_came_again_are_not_read_again(drops: Drops) -> None:
    """A keyed stream of daily full snapshots: an old snapshot holds no live row (every key came again in a newer
    one), so the target does not know it; the checkpoint keeps its fingerprint while it is listed, and no run
    reads it again."""
    drops.catalog(path="*.csv", primary_key="id", lookback_seconds=3600)
    for day in range(4):
        drops.write(f"day{day}.csv", csv_text(_rows(1, 5, f"d{day}")), BASE + day * 86400)
        assert drops.run().result.rows == 5
    assert drops.run().result.rows == 0
    assert drops.rows() == _rows(1, 5, "d3")
    seen = drops.store.latest(None).position["seen"]  # type: ignore[union-attr]
    assert sorted(seen) == ["day0.csv", "day1.csv", "day2.csv", "day3.csv"]
    (drops.folder / "day0.csv").unlink()  # retention: a gone file leaves the checkpoint
    assert drops.run().result.rows == 0
    assert sorted(drops.store.latest(None).position["seen"]) == ["day1.csv", "day2.csv", "day3.csv"]  # type: ignore[union-attr]


@pytest.mark.slow  # several loads (or a subprocess): beyond the default suite's time budget
def test_a_late_file_does_not_overwrite_newer_versions_of_its_keys(drops: Drops) -> None:
    drops.catalog(path="*.csv", primary_key="id")
    drops.write("new.csv", csv_text(_rows(1, 10, tag="new")), BASE + 100)
    drops.run()
    drops.write("old.csv", csv_text(_rows(1, 20, tag="old")), BASE + 50)
    drops.run()
    assert drops.rows() == sorted(_rows(1, 10, tag="new") + _rows(11, 10, tag="old"))


def test_a_slice_holding_an_older_and_a_newer_version_of_a_key_keeps_the_newer(drops: Drops) -> None:
    """Found by the files simulation (`make simulate KIND=files SEED=1002`): the version guard marked a key stale
    when one of the slice's versions of it was older than the target's, and so dropped the slice's newer one too
    (a late file and a new file read in one slice; or a file holding a key twice)."""
    drops.catalog(path="*.csv", primary_key="id")
    drops.write("m.csv", csv_text([(1, "middle", 2.0), (2, "middle", 2.0)]), BASE + 200)
    drops.run()
    drops.write("l.csv", csv_text([(1, "late", 1.0)]), BASE + 100)  # late: older than what the target holds
    drops.write("n.csv", csv_text([(1, "newest", 3.0), (2, "older", 0.5), (2, "newest", 3.0)]), BASE + 300)
    assert drops.run().result.slices == 1  # both files in one slice, one load
    assert drops.rows() == [(1, "newest", 3.0), (2, "newest", 3.0)]


def test_a_file_rewritten_with_an_older_time_or_its_rows_reordered_replaces_its_own_rows(drops: Drops) -> None:
    """Found by the files simulation (`make simulate KIND=files SEED=1005`): a row's version is (modified time,
    path, row), and the version guard kept the file's old rows when its rewrite had an older time (a copy that
    keeps an earlier time) or moved a key to an earlier row: the checkpoint said the new bytes were read, the
    target held the old ones. A file read again now replaces its own rows; other files' newer rows still win."""
    drops.catalog(path="*.csv", primary_key="id")
    drops.write("a.csv", csv_text([(1, "a1", 1.0), (2, "a1", 1.0), (3, "a1", 1.0)]), BASE + 100)
    drops.write("b.csv", csv_text([(3, "b", 9.0)]), BASE + 200)
    drops.run()
    drops.write("a.csv", csv_text([(1, "a2", 2.0), (2, "a2", 2.0), (3, "a2", 2.0), (4, "a2", 2.0)]), BASE + 50)
    drops.run()
    assert drops.rows() == [(1, "a2", 2.0), (2, "a2", 2.0), (3, "b", 9.0), (4, "a2", 2.0)]
    drops.write("a.csv", csv_text([(2, "a3", 3.0), (1, "a3", 3.0), (4, "a3", 3.0), (3, "a33", 3.0)]), BASE + 50)
    drops.run()  # same time, another size: key 1 moved from row 1 to row 2, key 2 from row 2 to row 1
    assert drops.rows() == [(1, "a3", 3.0), (2, "a3", 3.0), (3, "b", 9.0), (4, "a3", 3.0)]


def test_without_a_key_rows_are_keyed_by_file_and_row(drops: Drops) -> None:
    drops.catalog(path="*.csv")
    drops.write("a.csv", csv_text([(1, "x", 1.5), (1, "x", 1.5)]), BASE)
    drops.run()
    drops.write("a.csv", csv_text([(1, "y", 1.5), (1, "x", 1.5)]), BASE + 5)  # rewritten: same keys again
    drops.run()
    assert drops.rows("_ingest_file, _ingest_file_row, name") == [("a.csv", 1, "y"), ("a.csv", 2, "x")]


def test_bad_lines_and_broken_files_are_parked_and_the_rest_loads(drops: Drops) -> None:
    drops.catalog(path="*", primary_key="id", csv={"column_types": {"amount": "float64"}})
    drops.write("a.csv", "id,name,amount\n1,a,1.5\n2,b\n3,c,2.5\n4,d,oops\n", BASE + 1)
    drops.write("b.jsonl", '{"id": 5, "name": "e", "amount": 1.0}\n{"id": 6,\n[1]\n', BASE + 2)
    drops.write("c.csv", b"id,name,amount\n7,\xff\xfeg,3.5\n8,h,4.5\n", BASE + 3)
    broken = _parquet(_rows(100, 50))
    drops.write("d.parquet", broken[: len(broken) // 2], BASE + 4)  # truncated
    drops.write("e.csv.gz", gzip.compress(csv_text(_rows(200, 500)).encode())[:300], BASE + 5)  # truncated
    drops.write("f.parquet", _parquet(_rows(300, 3)), BASE + 6)
    outcome = drops.run()
    rows = drops.rows()
    ids = {r[0] for r in rows}
    assert {1, 3, 5, 8, 300, 301, 302} <= ids and not ids & {2, 4, 6, 7, *range(100, 150)}
    parked = dict(drops.dead_letters())
    assert parked["a.csv:line3"].startswith("file a.csv line 3: 2 fields where the header has 3")
    # rows are numbered by record, the short row 2 counted: `4,d,oops` is row 4 (on line 5)
    assert "'oops' is not a valid double" in parked["a.csv:row4"] and "row 4 (line 5)" in parked["a.csv:row4"]
    assert "not JSON" in parked["b.jsonl:line2"] and "not an object" in parked["b.jsonl:line3"]
    assert "invalid UTF-8" in parked["c.csv:row1"]
    assert "parked as a whole" in parked["d.parquet:file"]
    assert "parked as a whole" in parked["e.csv.gz:file"]
    assert outcome.result.dead_letters == len(parked)
    # the truncated gzip gave the rows before the break: they load, and the file is parked for the rest
    assert ids - {1, 3, 5, 8, 300, 301, 302} <= set(range(200, 700))
    assert drops.run().result.rows == 0  # parked files are not read again until they change


def test_rows_with_a_null_or_missing_key_are_parked_and_the_rest_of_the_stream_loads(drops: Drops) -> None:
    drops.catalog(path="*", primary_key="id")
    drops.write("a.csv", "id,name\n1,a\n,b\n3,c\n", BASE + 1)
    drops.write("b.jsonl", '{"id": 4, "name": "d"}\n{"name": "e"}\n{"id": null, "name": "f"}\n', BASE + 2)
    drops.write("c.jsonl", '{"name": "g"}\n', BASE + 3)  # no row of the file has the key
    drops.write("d.csv", "ID,name\n5,h\n", BASE + 4)  # the key spelled in capitals is still the key
    outcome = drops.run()
    assert drops.rows("id, name") == [(1, "a"), (3, "c"), (4, "d"), (5, "h")]
    parked = dict(drops.dead_letters())
    assert sorted(parked) == ["a.csv:row2", "b.jsonl:line2", "b.jsonl:line3", "c.jsonl:line1"]
    assert parked["a.csv:row2"].startswith("file a.csv row 2 (line 3): key column 'id' is null or missing")
    assert parked["b.jsonl:line2"].startswith("file b.jsonl line 2: key column 'id' is null or missing")
    assert outcome.result.dead_letters == 4


def test_an_unnamed_csv_column_is_dropped_while_empty_and_a_bad_header_parks_its_file(drops: Drops) -> None:
    drops.catalog(path="*.csv", primary_key="id")
    drops.write("a.csv", "id,name,\r\n1,a,\r\n2,b,\r\n", BASE + 1)  # a spreadsheet's trailing comma
    drops.write("b.csv", "id,name,\n3,c,\n4,d,oops\n", BASE + 2)  # the unnamed column holds a value
    drops.write("c.csv", b"id,na\xefme\n5,e\n", BASE + 3)  # the header is not UTF-8
    drops.write("d.csv", "id,name\n6,f\n", BASE + 4)
    drops.run()
    assert drops.rows("id, name") == [(1, "a"), (2, "b"), (6, "f")]
    parked = dict(drops.dead_letters())
    assert sorted(parked) == ["b.csv:file", "c.csv:file"]
    assert parked["b.csv:file"] == (
        "file b.csv parked as a whole: column 3 of the header has no name but row 2 holds 'oops' in it: "
        "name the column in the file's header, or give csv.column_names; "
        "the target keeps the previous version of each key of this file's rows until the file loads"
    )
    assert parked["c.csv:file"].startswith(
        "file c.csv parked as a whole: its header (line 1) is not valid utf-8 at byte 5 (b'\\xef')"
    )


def test_a_json_lines_file_starting_with_a_byte_order_mark_loads_its_first_line(drops: Drops) -> None:
    drops.catalog(path="*.jsonl", primary_key="id")
    drops.write("a.jsonl", b'\xef\xbb\xbf{"id": 1, "name": "a"}\n{"id": 2, "name": "b"}\n', BASE)
    assert drops.run().result.dead_letters == 0
    assert drops.rows("id, name") == [(1, "a"), (2, "b")]


def test_a_csv_read_resumed_inside_a_file_parks_a_repeated_bad_line_by_its_own_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found writing the files simulation (its bad CSV lines repeat texts on purpose): a read resumed after a bad
    line looked the next bad line up by its text from the file's start, found the earlier one, and parked it
    under the earlier line's key (merged into that dead letter: the later bad line was lost)."""
    monkeypatch.setattr(csv_reader, "BLOCK_BYTES", 64)  # small blocks: the file is read in pieces
    good = [f"{i},n{i},{i}\n" for i in range(1, 40)]
    path = tmp_path / "a.csv"
    path.write_text(
        "id,name,value\n" + "".join(good[:5]) + "oops\n" + "".join(good[5:29]) + "oops\n" + "".join(good[29:])
    )
    options = CsvOptions(column_types={"value": "int64"})
    pieces = list(csv_reader.read_csv(lambda: pa.OSFile(str(path)), options, Resume()))
    assert [b.line for p in pieces for b in p.bad] == [7, 32]
    stop = next(p for p in pieces if p.bad_done == 1 and not p.bad)  # a slice ended here, after the first
    resumed = csv_reader.read_csv(lambda: pa.OSFile(str(path)), options, Resume(stop.rows_done, stop.bad_done))
    assert [b.line for p in resumed for b in p.bad] == [32]


def test_a_column_spelled_differently_across_files_lands_in_one_column_and_a_file_mixing_them_is_parked(
    drops: Drops,
) -> None:
    drops.catalog(path="*", primary_key="ID", csv={"delimiter": ";"})  # the key spelled as no file spells it
    drops.write("a.csv", "id;name;select;Amount\n1;x;y;1.5\n2;w;v;2.5\n", BASE + 1)
    drops.write("b.csv", "Id;NAME;select;amount\n3;z;c;3.5\n", BASE + 2)
    drops.write("c.jsonl", '{"id": 4, "Name": "j", "select": "k", "amount": 4.5}\n', BASE + 3)
    drops.write("d.csv", "id;name;NAME\n5;p;q\n", BASE + 4)  # which one is the name?
    drops.write("e.csv", "id;_ingest_file\n6;mine\n", BASE + 5)
    drops.write("f.csv", "id;_Ingest_Batch\n7;mine\n", BASE + 6)  # under the prefix the product keeps for itself
    drops.run()
    loaded = drops.rows('id, name, "select", amount')
    assert loaded == [(1, "x", "y", 1.5), (2, "w", "v", 2.5), (3, "z", "c", 3.5), (4, "j", "k", 4.5)]
    parked = dict(drops.dead_letters())
    assert "columns 'name' and 'NAME' both land as column 'name'" in parked["d.csv:file"]
    assert "its column '_ingest_file' lands as '_ingest_file', a column the product writes" in parked["e.csv:file"]
    assert "its column '_Ingest_Batch' lands as '_ingest_batch', a column the product writes" in parked["f.csv:file"]


@pytest.mark.slow  # several loads (or a subprocess): beyond the default suite's time budget
def test_schema_drift_across_files_adds_widens_and_pauses(drops: Drops) -> None:
    drops.catalog(path="*.csv", primary_key="id")
    drops.write("1.csv", "id,code,qty\n1,10,3\n", BASE + 1)
    drops.run()
    drops.write("2.csv", "id,code,note\n2,20,hello\n", BASE + 2)  # a column added
    drops.write("3.csv", "id,code\n3,X-3\n", BASE + 3)  # integers widened to text
    outcome = drops.run()
    assert any("'note' added" in c for c in outcome.schema_changes)
    assert any("'code' changed type bigint -> text (widened)" in c for c in outcome.schema_changes)
    assert drops.rows("id, code, note, qty") == [(1, "10", None, 3), (2, "20", "hello", None), (3, "X-3", None, None)]
    drops.write("4.csv", "id,note,qty\n4,true,7\n", BASE + 4)  # bool into text: fits (cast), no change
    drops.write("5.csv", "id,qty\n5,2.5e0\n", BASE + 5)  # a bigint column of a double: incompatible
    with pytest.raises(SchemaPaused, match="'qty' changed type bigint -> double precision"):
        drops.run()
    after = drops.store.latest(None)
    # 4.csv and 5.csv share a slice: neither loaded, the checkpoint stays after 3.csv
    assert after is not None and after.position["path"] == "3.csv"
    assert [r[0] for r in drops.rows("id, code")] == [1, 2, 3]
    assert "accept" in after.details["last_error"]


def test_whole_numbers_after_decimals_load_into_the_double_column(drops: Drops) -> None:
    """A file of whole amounts after one with doubles paused the stream as 'double precision -> bigint
    (incompatible)' and the advised accept then failed the load (found by the README-only attack): integers a
    double holds exactly are cast to it; one past 2**53 still pauses (a double would round it)."""
    drops.catalog(path="*.csv", primary_key="id")
    drops.write("a.csv", "id,amt\n1,1.05e1\n", BASE + 1)
    drops.write("b.csv", "id,amt\n2,20\n3,-7\n", BASE + 2)
    outcome = drops.run()
    assert not outcome.schema_changes
    assert drops.rows("id, amt") == [(1, 10.5), (2, 20.0), (3, -7.0)]
    drops.write("c.csv", "id,amt\n4,9007199254740993\n", BASE + 3)
    with pytest.raises(SchemaPaused, match="'amt' changed type double precision -> bigint"):
        drops.run()


def test_whole_numbers_after_decimals_load_into_the_decimal_column_or_widen_it(drops: Drops) -> None:
    """Whole numbers the decimal column holds are cast to it; a larger one widens it (every digit kept)."""
    drops.catalog(path="*.csv", primary_key="id")
    drops.write("a.csv", "id,amt\n1,10.5\n", BASE + 1)
    drops.write("b.csv", "id,amt\n2,20\n3,-7\n", BASE + 2)
    assert not drops.run().schema_changes
    drops.write("c.csv", "id,amt\n4,9007199254740993\n", BASE + 3)
    assert drops.run().schema_changes == ["column 'amt' changed type numeric(3,1) -> numeric(20,1) (widened)"]
    assert drops.rows("id, amt::VARCHAR") == [(1, "10.5"), (2, "20.0"), (3, "-7.0"), (4, "9007199254740993.0")]


@pytest.mark.slow  # several loads (or a subprocess): beyond the default suite's time budget
def test_a_kill_in_the_middle_of_a_batch_of_files_resumes_exactly(drops: Drops, tmp_path: Path) -> None:
    drops.catalog(path="*.csv", primary_key="id", files_per_slice=3)
    for k in range(12):
        drops.write(f"f{k:02}.csv", csv_text(_rows(k * 10, 10)), BASE + k)
    script = (
        "import sys; from ingestion_assets_tests.files_helpers import Drops; from pathlib import Path; "
        "Drops(Path(sys.argv[1])).run()"
    )
    env = {"INGEST_FAULT": "after_load:2:kill", "PATH": "/usr/bin:/bin"}
    killed = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, timeout=300)
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    checkpoint = drops.store.latest(None)
    assert checkpoint is not None and checkpoint.position["path"] == "f05.csv"  # slices 0 and 1: 6 files
    outcome = drops.run()
    assert outcome.result.rows == 60  # files 6 to 11: the slice in flight, and the rest, nothing before
    assert drops.rows() == sorted(_rows(0, 120))


@pytest.mark.slow  # several loads (or a subprocess): beyond the default suite's time budget
def test_a_big_file_is_checkpointed_inside_and_resumed_inside(drops: Drops, tmp_path: Path) -> None:
    drops.catalog(path="*.parquet", primary_key="id", slice_rows=1000, batch_rows=500)
    drops.write("big.parquet", _parquet(_rows(0, 5000), row_group_size=700), BASE)
    env = {"INGEST_FAULT": "after_load:3:kill", "PATH": "/usr/bin:/bin"}
    script = "import sys; from ingestion_assets_tests.files_helpers import Drops; from pathlib import Path; Drops(Path(sys.argv[1])).run()"
    killed = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, timeout=300)
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    partial = drops.store.latest(None).position["partial"]  # type: ignore[union-attr]
    assert partial["path"] == "big.parquet" and 0 < partial["rows"] < 5000  # stopped inside the file
    assert drops.run().result.rows == 5000 - partial["rows"]  # resumed inside it: no row read twice
    assert drops.rows() == sorted(_rows(0, 5000))


@pytest.mark.slow  # several loads (or a subprocess): beyond the default suite's time budget
def test_materialized_through_dagster_with_an_asset_per_stream(drops: Drops) -> None:
    import dagster as dg

    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.defs.assets import build_stream_assets
    from ingestion_assets.defs.sources import source_specs

    drops.catalog(path="*.csv", primary_key="id")
    drops.write("a.csv", csv_text(_rows(1, 5)), time.time() - 60)
    catalog = load_catalog(drops.root / "catalog.yaml")
    assets = build_stream_assets(drops.settings, catalog)
    assert [a.key for a in assets] == [dg.AssetKey(["drops", "orders"])]
    assert [s.key for s in source_specs(catalog)] == [dg.AssetKey(["source", "drops", "files", "csv"])]
    with dg.DagsterInstance.ephemeral() as instance:
        assert dg.materialize(assets, instance=instance).success
        drops.write("b.csv", csv_text(_rows(6, 5)), time.time())
        result = dg.materialize(assets, instance=instance)
        assert result.success
    assert drops.rows() == sorted(_rows(1, 10))


def test_the_catalog_and_check_name_what_is_wrong_with_a_files_source(drops: Drops) -> None:
    from ingestion_assets.catalog import CatalogError, load_catalog
    from ingestion_assets.checks import check_catalog

    drops.catalog(path="*.csv", csv={"header": False})
    with pytest.raises(CatalogError, match=r"csv\.header is false: give csv\.column_names"):
        load_catalog(drops.root / "catalog.yaml")
    drops.url = "s3://user:secret@bucket/x"
    drops.catalog(path="*.csv")
    with pytest.raises(CatalogError, match=r"sources\.drops\.url: .*must not carry credentials"):
        load_catalog(drops.root / "catalog.yaml")
    drops.url = "gs://bucket/x"  # no gcsfs here: a problem named, not a traceback
    drops.catalog(path="*.csv")
    problems = check_catalog(drops.settings, load_catalog(drops.root / "catalog.yaml"))
    assert len(problems) == 1 and problems[0].startswith("stream drops.orders: cannot list *.csv")
    drops.url = None
    drops.catalog(path="*.csv")
    assert check_catalog(drops.settings, load_catalog(drops.root / "catalog.yaml")) == []


def test_a_folder_that_does_not_exist_fails_the_run_and_check_naming_the_stream_and_url(drops: Drops) -> None:
    """Found by the files attack: a wrong url listed as empty, and the run ended successfully with 0 rows."""
    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.checks import check_catalog
    from ingestion_assets.errors import classify
    from ingestion_assets.sources.files import MissingLocation

    missing = drops.root / "no-such-folder"
    drops.url = str(missing)
    drops.catalog(path="*.csv", primary_key="id")
    with pytest.raises(MissingLocation) as failed:
        drops.run()
    assert str(failed.value).startswith("stream drops.orders: the folder") and f"(url {missing})" in str(failed.value)
    assert not classify(failed.value).transient  # permanent: fails at once, no retries
    problems = check_catalog(drops.settings, load_catalog(drops.root / "catalog.yaml"))
    assert len(problems) == 1 and problems[0].startswith("stream drops.orders: the folder")
    assert f"(url {missing})" in problems[0]
    failure = drops.store.latest(None)  # the failure is recorded; no position moved
    assert failure is not None and failure.position is None and "no-such-folder does not exist" in str(failure.details)
    missing.mkdir()  # there, empty: 0 rows, no error
    assert drops.run().result.rows == 0
    assert check_catalog(drops.settings, load_catalog(drops.root / "catalog.yaml")) == []
    (missing / "a.csv").write_text(csv_text(_rows(1, 3)))
    assert drops.run().result.rows == 3
    assert drops.rows() == _rows(1, 3)
