"""A keyless file read again (rewritten in place) leaves in the target exactly the rows it holds now: no row of its
previous version survives under a number the new read did not give (a line gone bad or blank, a shorter file),
on DuckDB, PostgreSQL and a Delta lake, also when the read is cut into several slices."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from ingestion_assets_tests.destination_targets import mariadb
from ingestion_assets_tests.files_helpers import Drops, Target, target, target_catalog

__all__ = ["mariadb", "target"]  # fixtures; `target`: each test once on DuckDB, once on PostgreSQL

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


DAY_PARTITIONS = {"by": "time", "column": "seen_at", "start": "2026-01-01"}
DAYS = ["2026-01-01", "2026-01-02", "2026-01-03"]


def _days_csv(rows: list[tuple[str, str]], zone: str) -> str:
    return "seen_at,v\n" + "".join(f"2026-01-0{day}{zone},{v}\n" if day else f"{v}\n" for day, v in rows)


def _by_day(target: Target, naive: bool = False) -> list[tuple[Any, ...]]:
    day = "CAST(seen_at AS DATE)" if naive else "CAST(seen_at AT TIME ZONE 'UTC' AS DATE)"
    sql = f"SELECT _ingest_file_row, CAST({day} AS VARCHAR), v FROM drops.orders WHERE _ingest_deleted_at IS NULL"
    return sorted(target.query(sql + " ORDER BY 1"))


@pytest.mark.parametrize("zone", ["T10:00:00Z", " 23:59:59.999999"], ids=["zoned", "naive"])
def test_a_rewritten_file_in_a_stream_partitioned_by_a_column_keeps_no_stale_row(target: Target, zone: str) -> None:
    """Each partition reads every file and keeps its window's rows: a file rewritten shorter, with a row moved to
    another day and a line gone bad, kept its old rows there (r5 of day 2 and the old row 4 of day 3 twice), the
    run ok. Now each partition clears the rows of its own window the new read did not give, and only those."""
    target_catalog(target, "*.csv", primary_key=[], partitions=DAY_PARTITIONS)
    old = [("1", "a1"), ("2", "b2"), ("2", "b3"), ("3", "c4"), ("2", "b5"), ("2", "b6")]
    target.drops.write("a.csv", _days_csv(old, zone), BASE)
    for day in DAYS:
        target.drops.run(day)
    naive = zone.startswith(" ")
    assert _by_day(target, naive) == [(n, f"2026-01-0{d}", v) for n, (d, v) in enumerate(old, 1)]
    new = [("1", "a1"), ("2", "B2"), ("3", "c3"), ("", "x,y,z"), ("3", "c5")]  # line 5 of the wrong width
    target.drops.write("a.csv", _days_csv(new, zone), BASE + 10)
    target.drops.run(DAYS[1])
    # day 2 holds its new row 2 only; the rows of days 1 and 3 are no business of day 2's partition
    assert _by_day(target, naive) == [(1, "2026-01-01", "a1"), (2, "2026-01-02", "B2"), (4, "2026-01-03", "c4")]
    for day in (DAYS[0], DAYS[2]):
        target.drops.run(day)
    assert _by_day(target, naive) == [
        (1, "2026-01-01", "a1"),
        (2, "2026-01-02", "B2"),
        (3, "2026-01-03", "c3"),
        (5, "2026-01-03", "c5"),
    ]
    assert {key for key, _ in target.dead_letters()} == {"a.csv:line5"}  # parked by each partition that met it


def test_a_rewritten_file_partitioned_by_a_date_column_in_a_delta_lake(tmp_path: Any) -> None:
    """The same on a lake (rows flagged with `deletes: soft`), by a date column."""
    from ingestion_assets_tests.destination_targets import lake_rows

    drops = Drops(tmp_path)
    drops.catalog(path="*.csv", deletes="soft", partitions={**DAY_PARTITIONS, "column": "day"})
    lake = drops.root / "lake"
    drops.use_destination({"type": "filesystem", "bucket_url": str(lake), "table_format": "delta"})

    def days(rows: list[tuple[int, str]]) -> str:
        return "day,v\n" + "".join(f"2026-01-0{d},{v}\n" for d, v in rows)

    drops.write("a.csv", days([(1, "a1"), (2, "b2"), (2, "b3"), (3, "c4")]), BASE)
    for day in DAYS:
        drops.run(day)
    drops.write("a.csv", days([(1, "a1"), (3, "c2")]), BASE + 10)
    for day in DAYS:
        drops.run(day)
    rows = lake_rows("delta", str(lake / "drops" / "orders"), ["_ingest_file_row", "v", "_ingest_deleted_at"], "v")
    assert sorted((n, v) for n, v, at in rows if at is None) == [(1, "a1"), (2, "c2")]
    assert sorted((n, v) for n, v, at in rows if at is not None) == [(3, "b3"), (4, "c4")]


def test_a_replay_of_a_keyless_file_fixed_by_deleting_its_bad_line_keeps_no_stale_row(target: Target) -> None:
    """Deleting the bad line renumbers the rows after it: the replay loaded r3 and r4 under their new numbers and
    the old row 4 (r4) stayed beside them (r4 twice, the replay ok) until the next run read the file again."""
    from ingestion_assets.streams.files_replay import replay_file_dead_letters

    target_catalog(target, "*.csv", primary_key=[])
    target.drops.write("a.csv", "x,y\n1,r1\n2,r2,EXTRA\n3,r3\n4,r4\n", BASE)
    target.drops.run()
    target.drops.write("a.csv", "x,y\n1,r1\n3,r3\n4,r4\n", BASE + 10)
    details = target.drops.store.latest(None).details  # type: ignore[union-attr]
    replay = replay_file_dead_letters(target.drops.stream(), int(details["generation"]), dict(details))
    assert (replay.released, replay.loaded, replay.still_bad) == (1, 3, 0)
    assert target.query("SELECT _ingest_file_row, x, y FROM drops.orders ORDER BY 1") == [
        (1, 1, "r1"),
        (2, 3, "r3"),
        (3, 4, "r4"),
    ]


def test_a_rewritten_file_partitioned_by_a_column_on_mariadb_keeps_its_microseconds_and_no_stale_row(
    tmp_path: Any, mariadb: Any
) -> None:
    """MariaDB: the window is compared in microseconds from 1970 (its DATETIME has no zone), and the times keep their
    microseconds (a file's timestamps landed as DATETIME of whole seconds: `23:59:59.999999` read `23:59:59`)."""
    import datetime as dt

    drops = Drops(tmp_path)
    drops.catalog(path="*.csv", partitions=DAY_PARTITIONS)
    mariadb.datasets.append("drops")
    drops.use_destination(mariadb.destination())
    old = [("1", "a1"), ("2", "b2"), ("2", "b3"), ("3", "c4")]
    drops.write("a.csv", _days_csv(old, "T23:59:59.999999Z"), BASE)
    for day in DAYS:
        drops.run(day)
    drops.write("a.csv", _days_csv([("1", "a1"), ("3", "c2")], "T23:59:59.999999Z"), BASE + 10)
    for day in DAYS:
        drops.run(day)
    rows = mariadb.rows("drops", "orders", ["_ingest_file_row", "seen_at", "v"], "_ingest_file_row")
    assert rows == [
        (1, dt.datetime(2026, 1, 1, 23, 59, 59, 999999, tzinfo=dt.UTC), "a1"),
        (2, dt.datetime(2026, 1, 3, 23, 59, 59, 999999, tzinfo=dt.UTC), "c2"),
    ]
