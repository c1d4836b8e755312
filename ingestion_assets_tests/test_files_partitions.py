"""Partitions of a file stream: by the date or number in a path (Dagster partitions, backfilled as usual, each
with its own checkpoint, late files read by their partition's next run), or by a timestamp column, where
Parquet row groups whose statistics exclude the window are not read at all."""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ingestion_assets.catalog import CatalogError, load_catalog
from ingestion_assets.sources.files.parquet import read_parquet
from ingestion_assets.sources.files.pieces import Resume, RowWindow
from ingestion_assets_tests.files_helpers import Drops, csv_text

BASE = 1_767_225_600.0  # 2026-01-01T00:00Z, the drops' modified times start here
DAYS = [f"2026-01-0{d}" for d in range(1, 6)]


def _rows(first: int, count: int, tag: str) -> list[tuple[Any, ...]]:
    return [(i, f"{tag}-{i}", i * 0.5) for i in range(first, first + count)]


@pytest.fixture
def drops(tmp_path: Path) -> Drops:
    return Drops(tmp_path)


def _day_drops(drops: Drops) -> dict[str, list[tuple[Any, ...]]]:
    """Two files per day under dt=YYYY-MM-DD/, and one file outside any partition."""
    by_day: dict[str, list[tuple[Any, ...]]] = {}
    for index, day in enumerate(DAYS):
        first, second = _rows(index * 100, 5, day), _rows(index * 100 + 50, 5, day)
        drops.write(f"dt={day}/a.csv", csv_text(first), BASE + index * 86_400 + 10)
        drops.write(f"dt={day}/b.csv", csv_text(second), BASE + index * 86_400 + 20)
        by_day[day] = first + second
    drops.write("misc/stray.csv", csv_text(_rows(9000, 3, "stray")), BASE)
    return by_day


@pytest.mark.slow  # four Dagster runs (~4 s each here)
def test_a_month_of_drops_is_backfilled_as_dagster_partitions(drops: Drops) -> None:
    import dagster as dg

    from ingestion_assets.defs.assets import build_stream_assets
    from ingestion_assets.state.checkpoints import latest_checkpoint

    partitions = {"by": "time", "pattern": "dt={date}/", "start": "2026-01-01", "granularity": "daily"}
    drops.catalog(path="**/*.csv", primary_key="id", partitions=partitions)
    by_day = _day_drops(drops)
    assets = build_stream_assets(drops.settings, load_catalog(drops.root / "catalog.yaml"))
    key = dg.AssetKey(["drops", "orders"])
    assert assets[0].partitions_def is not None and assets[0].partitions_def.get_partition_keys()[:3] == DAYS[:3]
    with dg.DagsterInstance.ephemeral() as instance:
        range_tags = {"dagster/asset_partition_range_start": DAYS[0], "dagster/asset_partition_range_end": DAYS[2]}
        assert dg.materialize(assets, instance=instance, tags=range_tags).success  # a backfill: one run
        assert drops.rows() == sorted(r for day in DAYS[:3] for r in by_day[day])
        for day in DAYS[:3]:  # each partition its own checkpoint: its own files only
            checkpoint = latest_checkpoint(instance, key, day)
            assert checkpoint is not None and sorted(checkpoint.position["seen"]) == [
                f"dt={day}/a.csv",
                f"dt={day}/b.csv",
            ]
        assert latest_checkpoint(instance, key, DAYS[3]) is None
        assert dg.materialize(assets, instance=instance, partition_key=DAYS[3]).success
        late = _rows(170, 4, "late")  # lands in an old partition, keeping an old modified time
        drops.write(f"dt={DAYS[1]}/late.csv", csv_text(late), BASE + 86_400 + 30)
        assert dg.materialize(assets, instance=instance, partition_key=DAYS[1]).success
        checkpoint = latest_checkpoint(instance, key, DAYS[1])
        assert checkpoint is not None and "dt=2026-01-02/late.csv" in checkpoint.position["seen"]
    expected = [r for day in DAYS[:4] for r in by_day[day]] + late
    assert drops.rows() == sorted(expected)  # nothing of the stray file nor of the fifth day


@pytest.mark.slow  # five loads: beyond the default suite's time budget
def test_each_partition_reads_only_its_files_and_a_late_file_by_its_next_run(drops: Drops) -> None:
    partitions = {"by": "time", "pattern": "dt={date}/", "start": "2026-01-01"}
    drops.catalog(path="**/*.csv", primary_key="id", partitions=partitions)
    by_day = _day_drops(drops)
    assert drops.run(DAYS[0]).result.rows == 10
    assert drops.run(DAYS[2]).result.rows == 10
    assert drops.rows() == sorted(by_day[DAYS[0]] + by_day[DAYS[2]])
    late = _rows(30, 3, "late")
    drops.write(f"dt={DAYS[0]}/late.csv", csv_text(late), BASE + 15)  # older than a.csv's and b.csv's times
    assert drops.run(DAYS[2]).result.rows == 0  # another partition: not its file
    assert drops.run(DAYS[0]).result.rows == 3  # its partition's next run reads it, and only it
    assert drops.rows() == sorted(by_day[DAYS[0]] + by_day[DAYS[2]] + late)


def test_key_partitions_are_planned_from_the_numbers_in_the_paths(drops: Drops) -> None:
    import dagster as dg

    from ingestion_assets.defs.partitions import dynamic_partitions_name, plan_file_key_partitions

    drops.catalog(path="**/*.jsonl", partitions={"by": "key", "pattern": "shard={key}/", "chunk": 10})
    for shard in (3, 12, 17):
        drops.write(f"shard={shard}/part.jsonl", json.dumps({"id": shard, "name": f"s{shard}", "amount": 1.0}) + "\n")
    with dg.DagsterInstance.ephemeral() as instance:
        assert plan_file_key_partitions(drops.stream(), instance) == ["0-9", "10-19"]
        drops.write("shard=25/part.jsonl", json.dumps({"id": 25, "name": "s25", "amount": 1.0}) + "\n")
        assert plan_file_key_partitions(drops.stream(), instance) == ["20-29"]  # continues, no gap
        assert instance.get_dynamic_partitions(dynamic_partitions_name("drops", "orders")) == ["0-9", "10-19", "20-29"]
    assert drops.run("10-19").result.rows == 2
    assert drops.rows("_ingest_file, id, name") == [
        ("shard=12/part.jsonl", 12, "s12"),
        ("shard=17/part.jsonl", 17, "s17"),
    ]


def test_partitions_that_cannot_place_a_file_are_refused_in_the_catalog(drops: Drops) -> None:
    for partitions, message in [
        ({"by": "time", "pattern": "dt={dt}/", "start": "2026-01-01"}, r"unknown \['dt'\]"),
        ({"by": "time", "pattern": "dt={date}/", "start": "2026-01-01", "granularity": "hourly"}, "need {hour}"),
        ({"by": "time", "start": "2026-01-01"}, "give `pattern`.*or `column`"),
        ({"by": "key", "pattern": "x={key}/{key}", "chunk": 5}, "exactly one {key}"),
    ]:
        drops.catalog(path="**/*.csv", partitions=partitions)
        with pytest.raises(CatalogError, match=message):
            load_catalog(drops.root / "catalog.yaml")


def _days_parquet(days: int, rows_per_day: int) -> bytes:
    """One row group per day of `event_at` (UTC), rows numbered through the file."""
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    ids = list(range(days * rows_per_day))
    moments = [start + dt.timedelta(days=i // rows_per_day, seconds=i % rows_per_day) for i in ids]
    table = pa.table(
        {"id": ids, "event_at": pa.array(moments, pa.timestamp("us", tz="UTC")), "v": [i * 2 for i in ids]}
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=rows_per_day)
    return buffer.getvalue()


class _Counting(io.RawIOBase):
    """The real file, with the byte ranges Parquet asked of it written down."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("rb")
        self.ranges: list[tuple[int, int]] = []

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def readinto(self, buffer: Any) -> int:
        start = self._file.tell()
        data = self._file.read(len(buffer))
        buffer[: len(data)] = data
        if data:
            self.ranges.append((start, start + len(data)))
        return len(data)


def test_parquet_row_groups_outside_the_window_are_not_read(tmp_path: Path) -> None:
    path = tmp_path / "events.parquet"
    path.write_bytes(_days_parquet(days=8, rows_per_day=20_000))  # row groups of ~400 kB
    counting = _Counting(path)
    day = dt.datetime(2026, 1, 4, tzinfo=dt.UTC)
    window = RowWindow("event_at", day, day + dt.timedelta(days=1))
    pieces = list(read_parquet(lambda: pa.PythonFile(counting, mode="r"), 5000, Resume(), window))
    read = pa.concat_tables([p.table for p in pieces if p.table is not None])
    assert read.column("id").to_pylist() == list(range(3 * 20_000, 4 * 20_000))  # that day's group, all of it
    assert pieces[-1].rows_done == 8 * 20_000  # the skipped groups count as given (a resume goes past them)
    metadata = pq.ParquetFile(path).metadata
    footer_read = path.stat().st_size - 65_536  # Arrow reads the file's last 64 kB at once to find the footer
    for group in range(metadata.num_row_groups):
        chunks = [metadata.row_group(group).column(c) for c in range(metadata.num_columns)]
        low = min(c.dictionary_page_offset or c.data_page_offset for c in chunks)
        high = max((c.dictionary_page_offset or c.data_page_offset) + c.total_compressed_size for c in chunks)
        touched = [(s, e) for s, e in counting.ranges if s < high and e > low and s < footer_read]
        assert bool(touched) == (group == 3), f"row group {group}: bytes {touched} read"


def test_a_column_partition_keeps_its_rows_and_parks_rows_with_no_time(drops: Drops) -> None:
    partitions = {"by": "time", "column": "event_at", "start": "2026-01-01"}
    drops.catalog(path="*", primary_key="id", partitions=partitions)
    drops.write("days.parquet", _days_parquet(days=5, rows_per_day=100), BASE)
    lines = [
        {"id": 1000, "event_at": "2026-01-03T05:00:00+00:00"},
        {"id": 1001, "event_at": None},
        {"id": 1002, "event_at": "2026-01-02T23:59:59+00:00"},
    ]
    drops.write("extra.jsonl", "".join(json.dumps(line) + "\n" for line in lines), BASE + 1)
    outcome = drops.run("2026-01-03")
    assert drops.rows("id, _ingest_file") == [(i, "days.parquet") for i in range(200, 300)] + [(1000, "extra.jsonl")]
    assert outcome.result.dead_letters == 1
    ((key, error),) = drops.dead_letters()
    assert key == "extra.jsonl:row2" and "'event_at' is None: the row belongs to no partition" in error
    drops.run("2026-01-02")
    assert len(drops.rows("id, _ingest_file")) == 100 + 100 + 2  # each row in exactly one partition


def test_check_names_the_files_no_partition_reads(drops: Drops) -> None:
    from ingestion_assets.checks import check_catalog

    drops.catalog(path="**/*.csv", partitions={"by": "time", "pattern": "dt={date}/", "start": "2026-01-01"})
    drops.write("dt=2026-01-03/a.csv", csv_text(_rows(1, 1, "a")))
    assert check_catalog(drops.settings, load_catalog(drops.root / "catalog.yaml")) == []
    drops.write("dt=2025-12-31/old.csv", csv_text(_rows(2, 1, "old")))  # before the start
    drops.write("misc/stray.csv", csv_text(_rows(3, 1, "stray")))
    (problem,) = check_catalog(drops.settings, load_catalog(drops.root / "catalog.yaml"))
    assert "2 file(s) match **/*.csv but no partition reads them" in problem
    assert "dt=2025-12-31/old.csv" in problem and "misc/stray.csv" in problem


def test_json_lines_times_without_a_zone_and_dates_place_their_rows(drops: Drops) -> None:
    """JSON lines write times as text: one without a zone (or a date) parked the whole file ("expected a zone
    offset"). Now it is a wall time placed as UTC, as a CSV's is; a file mixing both forms is still parked."""
    drops.catalog(path="*.jsonl", primary_key="id", partitions={"by": "time", "column": "at", "start": "2026-01-01"})
    lines = [(1, "2026-01-02T23:59:59.5"), (2, "2026-01-03"), (3, "2026-01-02 00:00:00"), (4, "2026-01-01T12:00:00")]
    drops.write("a.jsonl", "".join(json.dumps({"id": i, "at": at}) + "\n" for i, at in lines), BASE)
    drops.write("b.jsonl", '{"id": 5, "at": "2026-01-02T01:00:00Z"}\n{"id": 6, "at": "2026-01-02T01:00:00"}\n', BASE)
    drops.run("2026-01-02")
    assert drops.rows('id, CAST("at" AS VARCHAR)') == [(1, "2026-01-02 23:59:59.5"), (3, "2026-01-02 00:00:00")]
    ((key, error),) = drops.dead_letters()
    assert key == "b.jsonl:file" and "mixes times with and without a zone" in error


def test_rows_before_the_first_window_are_parked_by_the_first_window_not_dropped(drops: Drops) -> None:
    """A row dated before every window was left out by every partition, silently (found by a README-only attack
    on tables; files partitioned by a column had the same hole). The first window's run parks it, saying why,
    from a whole Parquet row group of such rows too (its statistics no longer let the first window skip it)."""
    drops.catalog(path="*", primary_key="id", partitions={"by": "time", "column": "event_at", "start": "2026-01-03"})
    drops.write("days.parquet", _days_parquet(days=4, rows_per_day=50), BASE)  # 2026-01-01 .. 2026-01-04
    lines = [{"id": 1000, "event_at": "2025-12-31T23:00:00+00:00"}, {"id": 1001, "event_at": "2026-01-03T01:00:00Z"}]
    drops.write("extra.jsonl", "".join(json.dumps(line) + "\n" for line in lines), BASE + 1)
    outcome = drops.run("2026-01-04")  # not the first window: its own rows only, nothing parked
    assert outcome.result.dead_letters == 0 and len(drops.rows("id, v")) == 50
    outcome = drops.run("2026-01-03")
    ids = [row[0] for row in drops.rows("id, v")]
    assert ids == [*range(100, 200), 1001]
    assert outcome.result.dead_letters == 100 + 1
    parked = dict(drops.dead_letters())
    assert "before the first partition's window (2026-01-03T00:00:00+00:00)" in parked["extra.jsonl:row1"]
    assert "move the partitions' `start` back" in parked["extra.jsonl:row1"]
    assert len([k for k in parked if k.startswith("days.parquet")]) == 100


def test_files_dated_between_start_and_the_first_weekly_window_are_named_unplaced() -> None:
    """Weekly windows start on a Sunday: with `start` on a Wednesday, a file dated that Thursday is in no window
    (check named only files before `start`)."""
    from ingestion_assets.catalog import FilesStream
    from ingestion_assets.streams.files_partitions import unplaced

    partitions = {"by": "time", "pattern": "dt={date}/", "start": "2026-01-07", "granularity": "weekly"}
    spec = FilesStream.model_validate({"path": "**/*.csv", "primary_key": "id", "partitions": partitions})
    assert unplaced(spec, ["dt=2026-01-08/a.csv", "dt=2026-01-11/b.csv"]) == ["dt=2026-01-08/a.csv"]
