"""A keyless file read again (rewritten in place) leaves in the target exactly the rows it holds now: no row of its
previous version survives under a number the new read did not give (a line gone bad or blank, a shorter file),
on DuckDB, PostgreSQL and a Delta lake, also when the read is cut into several slices."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from ingestion_assets_tests.files_helpers import Drops, Target, target, target_catalog

__all__ = ["target"]  # the fixture: each test once on DuckDB, once on PostgreSQL

BASE = 1_700_000_000.0
GOOD = "x,y\n10,r1\n11,r2\n12,r3\n13,r4\n14,r5\n"
BAD_MIDDLE = "x,y\n10,r1\n11,r2,EXTRA\n12,r3\n13,r4\n14,r5\n"


def _values(target: Target) -> list[tuple[Any, ...]]:
    return target.query("SELECT x, y FROM drops.orders WHERE _ingest_deleted_at IS NULL ORDER BY x, y")


def test_a_csv_rewritten_with_a_malformed_middle_row_keeps_no_stale_row(target: Target) -> None:
    """The attacker's case: r1..r5, then line 3 given an extra field. The good rows were renumbered 1..4 and the
    old row 5 (r5) stayed: r5 twice, the run ok. Now the target holds r1, r3, r4, r5 once each, row by row."""
    target_catalog(target, "*.csv", primary_key=[])
    target.drops.write("shift.csv", GOOD, BASE)
    target.drops.run()
    target.drops.write("shift.csv", BAD_MIDDLE, BASE + 10)
    outcome = target.drops.run()
    assert _values(target) == [(10, "r1"), (12, "r3"), (13, "r4"), (14, "r5")]
    assert outcome.result.dead_letters == 1
    assert [key for key, _ in target.dead_letters()] == ["shift.csv:line3"]


def test_a_jsonl_line_gone_bad_or_blank_leaves_no_old_value(target: Target) -> None:
    """JSON lines are numbered by line: the old value of a line that went bad stayed beside its dead letter, as if
    valid, and a line emptied kept its old row too. Now only the file's good lines are left."""
    target_catalog(target, "*.jsonl", primary_key=[])
    target.drops.write("a.jsonl", '{"x":10,"y":"a"}\n{"x":11,"y":"b"}\n{"x":12,"y":"c"}\n{"x":13,"y":"d"}\n', BASE)
    target.drops.run()
    target.drops.write("a.jsonl", '{"x":10,"y":"a"}\n{"x":11,\n\n{"x":13,"y":"d"}\n', BASE + 10)
    target.drops.run()
    assert _values(target) == [(10, "a"), (13, "d")]
    assert [key for key, _ in target.dead_letters()] == ["a.jsonl:line2"]


def test_a_shorter_rewrite_read_in_several_slices_keeps_only_its_rows(tmp_path: Any) -> None:
    """Slices cut inside the file: each slice clears only the numbers it covered, the last one up to the end."""
    drops = Drops(tmp_path)
    drops.catalog(path="*.csv", slice_rows=2)
    drops.write("a.csv", "x,y\n" + "".join(f"{i},v{i}\n" for i in range(1, 8)), BASE)
    drops.run()
    drops.write("a.csv", "x,y\n1,w1\n2,w2,bad\n3,w3\n4,w4\n", BASE + 10)
    drops.run()
    assert drops.rows("x, y", "orders") == [(1, "w1"), (3, "w3"), (4, "w4")]


@pytest.mark.parametrize("deletes", ["keep", "soft"])
def test_a_rewritten_keyless_file_in_a_delta_lake(tmp_path: Any, deletes: str) -> None:
    from ingestion_assets_tests.destination_targets import lake_rows

    drops = Drops(tmp_path)
    drops.catalog(path="*.csv", deletes=deletes)
    catalog = yaml.safe_load(drops.settings.catalog_path.read_text())
    lake = drops.root / "lake"
    catalog["destination"] = {"type": "filesystem", "bucket_url": str(lake), "table_format": "delta"}
    drops.settings.catalog_path.write_text(yaml.safe_dump(catalog))
    drops.write("shift.csv", GOOD, BASE)
    drops.run()
    drops.write("shift.csv", BAD_MIDDLE, BASE + 10)
    drops.run()
    rows = lake_rows("delta", str(lake / "drops" / "orders"), ["x", "y", "_ingest_deleted_at"], "x")
    live = sorted((x, y) for x, y, at in rows if at is None)
    assert live == [(10, "r1"), (12, "r3"), (13, "r4"), (14, "r5")]
    assert len(rows) == (5 if deletes == "soft" else 4)  # soft: the stale row stays, flagged


def test_a_bad_csv_line_keeps_its_number_and_the_rows_after_it_keep_theirs(tmp_path: Any) -> None:
    """Rows are numbered by record, rows of the wrong width counted: r3..r5 keep 3..5 when line 3 goes bad."""
    drops = Drops(tmp_path)
    drops.catalog(path="*.csv")
    drops.write("shift.csv", GOOD, BASE)
    drops.run()
    drops.write("shift.csv", BAD_MIDDLE, BASE + 10)
    drops.run()
    assert drops.rows("_ingest_file_row, y", "orders") == [(1, "r1"), (3, "r3"), (4, "r4"), (5, "r5")]
