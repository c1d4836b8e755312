"""Files whose values or shapes are at the edge of what a reader or a target holds: a huge CSV field or JSON
line, CSV columns typed differently from file to file, Parquet types a target cannot hold. Each value loads
exactly, or its row, file or stream stops with a message naming what and why; never a silent change."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

import ingestion_assets.sources.files.csv as csv_reader
from ingestion_assets_tests.files_helpers import Drops

BASE = 1_700_000_000.0
HUGE = "x" * (20 << 20)  # a 20 MB field


@pytest.fixture
def drops(tmp_path: Path) -> Drops:
    return Drops(tmp_path)


def test_a_20mb_csv_field_and_json_line_load_whole(drops: Drops) -> None:
    """A row longer than the CSV reader's block parked the file after its first rows ("straddling object")."""
    drops.catalog(path="*", primary_key="id")
    drops.write("a.csv", f'id,name,amount\n1,a,1\n2,"{HUGE}",2\n3,c,3\n', BASE + 1)
    records = [{"id": 4, "name": "d", "amount": 4}, {"id": 5, "name": HUGE, "amount": 5}]
    drops.write("b.jsonl", "".join(json.dumps(r) + "\n" for r in records), BASE + 2)
    drops.run()
    lengths = [(1, 1, 1), (2, len(HUGE), 2), (3, 1, 3), (4, 1, 4), (5, len(HUGE), 5)]
    assert drops.rows("id, length(name), amount") == lengths


def test_a_csv_row_longer_than_the_limit_parks_the_file_naming_the_setting(drops: Drops) -> None:
    drops.catalog(path="*.csv", primary_key="id", csv={"max_row_bytes": 1 << 20})
    drops.write("a.csv", f"id,name,amount\n1,a,1\n2,{HUGE[: 2 << 20]},2\n", BASE + 1)
    drops.write("b.csv", "id,name,amount\n3,c,3\n", BASE + 2)
    drops.run()
    assert drops.rows() == [(1, "a", 1), (3, "c", 3)]  # the rows before it load, as from a truncated file
    ((key, error),) = drops.dead_letters()
    assert key == "a.csv:file"
    assert "longer than csv.max_row_bytes (1048576 bytes): raise csv.max_row_bytes" in error


def test_csv_values_keep_their_digits_whatever_file_or_batch_they_are_in(
    drops: Drops, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inference typed a code 007 as the integer 7, an integer past int64 or a decimal of 19 digits as a double
    (1e+20): values changed silently. Such columns are text; a file or batch that needs a wider type than the
    target holds widens it, said in the run's schema changes."""
    monkeypatch.setattr(csv_reader, "BLOCK_BYTES", 64)  # small blocks: each file is read in several batches
    drops.catalog(path="*.csv", primary_key="id")
    early = "".join(f"{i},{i},{i},0.5,2024-01-0{i}\n" for i in range(1, 6))
    drops.write("1.csv", "id,code,big,ratio,day\n" + early + "6,007,6,0.5,2024-01-06\n", BASE + 1)
    drops.write("2.csv", "id,code,big,ratio,day\n7,0042,99999999999999999999,0.1234567890123456789,soon\n", BASE + 2)
    outcome = drops.run()
    loaded = drops.rows("id, code, big, ratio, day")
    assert loaded[4:] == [
        (5, "5", "5", "0.5", "2024-01-05"),
        (6, "007", "6", "0.5", "2024-01-06"),
        (7, "0042", "99999999999999999999", "0.1234567890123456789", "soon"),
    ]
    assert sorted(outcome.schema_changes) == [
        "column 'big' changed type bigint -> text (widened)",
        "column 'code' changed type bigint -> text (widened)",
        "column 'day' changed type date -> text (widened)",
        "column 'ratio' changed type double precision -> text (widened)",
    ]


def test_csv_leading_zeros_alone_stay_text_and_plain_numbers_stay_numbers(drops: Drops) -> None:
    drops.catalog(path="*.csv", primary_key="id")
    drops.write(
        "1.csv",
        "id,zip,qty,price,seen,opens\n1,01234,3,1.25,2024-01-02 10:00:00,09:30:00\n2,90210,-4,1e3,,\n",
        BASE + 1,
    )
    drops.run()
    assert drops.rows("id, zip, qty, price, seen::varchar, opens") == [
        (1, "01234", 3, 1.25, "2024-01-02 10:00:00+00", dt.time(9, 30)),
        (2, "90210", -4, 1000.0, None, None),
    ]
