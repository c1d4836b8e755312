"""Files whose values or shapes are at the edge of what a reader or a target holds: a huge CSV field or JSON
line, CSV columns typed differently from file to file, Parquet types a target cannot hold. Each value loads
exactly, or its row, file or stream stops with a message naming what and why; never a silent change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
