"""Files deleted at the source (`deletes: keep | hard | soft`): their rows stay, go, or are flagged, for a keyless
stream (rows keyed by file and row) and a keyed one; a file put back is read again; an empty listing retires
nothing."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingestion_assets.streams.runner import PartitionJob
from ingestion_assets_tests.files_helpers import Drops, csv_text

BASE = 1_700_000_000.0


def _rows(first: int, count: int, tag: str = "v1") -> list[tuple[Any, ...]]:
    return [(i, f"{tag}-{i}", i * 0.5) for i in range(first, first + count)]


@pytest.fixture
def drops(tmp_path: Path) -> Drops:
    return Drops(tmp_path)


def test_a_deleted_file_takes_its_rows_with_it_in_a_keyless_stream(drops: Drops) -> None:
    drops.catalog(path="*.csv", deletes="hard")
    drops.write("a.csv", csv_text(_rows(1, 3)), BASE)
    drops.write("b.csv", csv_text(_rows(1, 2, "b")), BASE + 1)  # the same ids: keyless, both files' rows stay
    drops.run()
    (drops.folder / "a.csv").unlink()
    outcome = drops.run()
    assert outcome.result.figures["files_deleted"] == 1 and outcome.result.figures["rows_retired"] == 3
    assert drops.rows("_ingest_file, _ingest_file_row, name") == [("b.csv", 1, "b-1"), ("b.csv", 2, "b-2")]
    drops.write("a.csv", csv_text(_rows(1, 3)), BASE)  # put back as it was (same fingerprint): read again
    assert drops.run().result.rows == 3
    assert [r[0] for r in drops.rows("_ingest_file, _ingest_file_row")] == ["a.csv"] * 3 + ["b.csv"] * 2


@pytest.mark.slow  # several loads: beyond the default suite's time budget
def test_soft_deletes_flag_the_keys_a_deleted_file_last_delivered(drops: Drops) -> None:
    drops.catalog(path="*.csv", primary_key="id", deletes="soft")
    drops.write("a.csv", csv_text(_rows(1, 4)), BASE)
    drops.write("b.csv", csv_text(_rows(3, 4, "b")), BASE + 1)  # ids 3, 4 newer here than in a.csv
    drops.run()
    (drops.folder / "a.csv").unlink()
    assert drops.run().result.figures["rows_retired"] == 2  # ids 1 and 2: 3 and 4 came from b.csv
    flagged = drops.rows("id, _ingest_file, _ingest_deleted_at IS NOT NULL")
    assert flagged == [(1, "a.csv", True), (2, "a.csv", True)] + [(i, "b.csv", False) for i in range(3, 7)]
    drops.write("a.csv", csv_text(_rows(1, 2, "v2")), BASE + 5)  # back, rewritten: live again
    drops.run()
    assert drops.rows("id, name, _ingest_deleted_at IS NOT NULL")[:2] == [(1, "v2-1", False), (2, "v2-2", False)]


def test_keep_leaves_the_rows_and_an_empty_listing_retires_nothing(drops: Drops) -> None:
    drops.catalog(path="*.csv", primary_key="id")  # deletes: keep, the default
    drops.write("a.csv", csv_text(_rows(1, 3)), BASE)
    drops.run()
    (drops.folder / "a.csv").unlink()
    drops.run()
    assert [r[0] for r in drops.rows()] == [1, 2, 3]
    drops.catalog(path="*.csv", primary_key="id", deletes="hard")
    shutil.rmtree(drops.folder)  # every file gone (a wrong prefix looks the same): refuse to empty the target
    drops.folder.mkdir()
    outcome = drops.run()
    assert outcome.result.note is not None and "nothing retired" in outcome.result.note
    assert [r[0] for r in drops.rows()] == [1, 2, 3]


@pytest.mark.slow  # several loads: beyond the default suite's time budget
def test_a_deleted_file_in_one_partition_retires_only_there(drops: Drops) -> None:
    partitions = {"by": "time", "pattern": "dt={date}/", "start": "2026-01-01"}
    drops.catalog(path="**/*.csv", deletes="hard", partitions=partitions)
    drops.write("dt=2026-01-01/a.csv", csv_text(_rows(1, 2)), BASE)
    drops.write("dt=2026-01-02/a.csv", csv_text(_rows(11, 2)), BASE)
    drops.run("2026-01-01")
    drops.run("2026-01-02")
    (drops.folder / "dt=2026-01-02" / "a.csv").unlink()
    assert drops.run("2026-01-01").result.figures["files_deleted"] == 0  # not its file
    assert len(drops.rows("_ingest_file, _ingest_file_row")) == 4
    assert drops.run("2026-01-02").result.figures["files_deleted"] == 1
    assert drops.rows("_ingest_file, _ingest_file_row") == [("dt=2026-01-01/a.csv", 1), ("dt=2026-01-01/a.csv", 2)]


def test_dead_letter_replay_loads_the_fixed_file_and_keeps_what_is_still_bad(drops: Drops) -> None:
    from ingestion_assets.streams.files_replay import replay_file_dead_letters

    drops.catalog(path="*.csv", primary_key="id", csv={"column_types": {"amount": "float64"}})
    drops.write("a.csv", "id,name,amount\n1,a,1.5\n2,b,oops\n3,c,2.5\n", BASE)
    drops.write("b.csv", "id,name,amount\n4,d,1.0\n5,e\n", BASE + 1)
    drops.write("c.csv", "id,name,amount\n6,f,nope\n", BASE + 2)
    drops.run()
    assert [k for k, _ in drops.dead_letters()] == ["a.csv:row2", "b.csv:line3", "c.csv:row1"]
    drops.write("a.csv", "id,name,amount\n1,a,1.5\n2,b,2.0\n3,c,2.5\n", BASE)  # fixed by the user
    (drops.folder / "c.csv").unlink()  # gone: its dead letter stays for a person to decide
    details = drops.store.latest(None).details  # type: ignore[union-attr]
    replay = replay_file_dead_letters(drops.stream(), int(details["generation"]), dict(details))
    assert (replay.parked, replay.released, replay.loaded, replay.still_bad, replay.gone) == (3, 1, 4, 1, ["c.csv:row1"])
    assert drops.rows() == [(1, "a", 1.5), (2, "b", 2.0), (3, "c", 2.5), (4, "d", 1.0)]
    parked = dict(drops.dead_letters())
    assert sorted(parked) == ["b.csv:line3", "c.csv:row1"] and "2 fields" in parked["b.csv:line3"]


def test_reconcile_on_a_files_stream_says_what_files_streams_do_instead(drops: Drops) -> None:
    from ingestion_assets.cli.quality import _no_reconcile

    drops.catalog(path="*.csv", deletes="soft")
    told = _no_reconcile(drops.stream())
    assert "`deletes: keep|hard|soft` (now soft)" in told and "files gone from the source" in told
    assert "cdc" not in told


@pytest.mark.parametrize(
    ("table_format", "deletes"), [("delta", "hard"), pytest.param("iceberg", "soft", marks=pytest.mark.slow)]
)
def test_a_deleted_file_retires_its_rows_in_a_lake(drops: Drops, table_format: str, deletes: str) -> None:
    from ingestion_assets_tests.destination_targets import lake_rows

    drops.catalog(path="*.csv", primary_key="id", deletes=deletes)
    catalog = yaml.safe_load(drops.settings.catalog_path.read_text())
    lake = drops.root / "lake"
    catalog["destination"] = {"type": "filesystem", "bucket_url": str(lake), "table_format": table_format}
    drops.settings.catalog_path.write_text(yaml.safe_dump(catalog))
    drops.write("a.csv", csv_text(_rows(1, 2)), BASE)
    drops.write("b.csv", csv_text(_rows(3, 2, "b")), BASE + 1)
    drops.run()
    (drops.folder / "a.csv").unlink()
    outcome = drops.run()
    assert outcome.result.figures["files_deleted"] == 1 and outcome.result.figures["rows_retired"] == 2
    rows = lake_rows(table_format, str(lake / "drops" / "orders"), ["id", "_ingest_deleted_at"], "id")
    live = [(i, at is None) for i, at in rows]
    assert live == ([(1, False), (2, False)] if deletes == "soft" else []) + [(3, True), (4, True)]


class _DiesAtTheEnd:
    """The run's last checkpoint (after the deleted files' rows were retired) is lost: the process died first."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def latest(self, partition: str | None) -> Any:
        return self.store.latest(partition)

    def commit(self, partition: str | None, position: Any, **details: Any) -> None:
        if details.get("complete"):
            raise KeyboardInterrupt("the process died before its last checkpoint was stored")
        self.store.commit(partition, position, **details)


def test_a_file_put_back_is_read_again_when_its_retirement_was_never_checkpointed(drops: Drops) -> None:
    """The rows of a deleted file were retired, then the process died before the checkpoint that forgets the file;
    the next run found nothing left to retire and kept the file's fingerprint as read, so the file put back as it
    was (same bytes, same time) was never read again. A file the listing no longer shows now leaves the position
    at every run."""
    drops.catalog(path="*.csv", deletes="hard")
    drops.write("a.csv", csv_text(_rows(1, 3)), BASE)
    drops.write("b.csv", csv_text(_rows(1, 2, "b")), BASE + 1)
    drops.run()
    (drops.folder / "a.csv").unlink()
    with pytest.raises(KeyboardInterrupt):
        PartitionJob(drops.stream(), _DiesAtTheEnd(drops.store), run_id="test").run()  # type: ignore[arg-type]
    assert [r[0] for r in drops.rows("_ingest_file, _ingest_file_row")] == ["b.csv"] * 2  # retired, not checkpointed
    drops.run()  # nothing left to retire
    drops.write("a.csv", csv_text(_rows(1, 3)), BASE)  # put back as it was
    drops.run()
    assert [r[0] for r in drops.rows("_ingest_file, _ingest_file_row")] == ["a.csv"] * 3 + ["b.csv"] * 2


def test_a_file_renamed_keeping_its_old_time_moves_its_rows_instead_of_losing_them(drops: Drops) -> None:
    """Found by the files attack: `mv m.csv a.csv` keeps the modified time; older than the lookback window, a.csv
    was taken as read and m.csv's rows retired: rc 0, rows gone. Now a.csv is read (nothing knew it) before any
    retirement, and its rows take over the keys even though their versions differ from m.csv's only by the path
    (a.csv sorts before m.csv: the version guard used to keep m.csv's rows, then retire them)."""
    drops.catalog(path="*.csv", primary_key="id", deletes="hard", lookback_seconds=3600)
    drops.write("m.csv", csv_text(_rows(1, 3)), BASE)
    drops.write("n.csv", csv_text(_rows(4, 2, "n")), BASE + 10_000)  # the newest: m.csv is older than the window
    drops.run()
    expected = _rows(1, 3) + _rows(4, 2, "n")
    for old, new in (("m.csv", "z.csv"), ("z.csv", "a.csv")):  # a later name, then an earlier one
        (drops.folder / old).rename(drops.folder / new)  # mv: the modified time stays BASE
        outcome = drops.run()
        figures = outcome.result.figures
        assert (outcome.result.rows, figures["files_read_unknown_old"], figures["files_deleted"]) == (3, 1, 0)
        held = [(i, new, name, amount) for i, name, amount in _rows(1, 3)]
        assert drops.rows("id, _ingest_file, name, amount") == held + [(i, "n.csv", n, a) for i, n, a in expected[3:]]
    assert drops.rows() == expected
    assert drops.run().result.rows == 0


def test_a_keyless_file_renamed_keeping_its_old_time_is_read_before_the_old_name_is_retired(drops: Drops) -> None:
    drops.catalog(path="*.csv", deletes="soft", lookback_seconds=3600)
    drops.write("m.csv", csv_text(_rows(1, 3)), BASE)
    drops.write("n.csv", csv_text(_rows(4, 2, "n")), BASE + 10_000)
    drops.run()
    (drops.folder / "m.csv").rename(drops.folder / "a.csv")
    outcome = drops.run()
    assert (outcome.result.rows, outcome.result.figures["rows_retired"]) == (3, 3)
    live = drops.rows("_ingest_file, _ingest_file_row, id, name, amount, _ingest_deleted_at IS NULL")
    assert live == (
        [("a.csv", r, *row, True) for r, row in enumerate(_rows(1, 3), 1)]
        + [("m.csv", r, *row, False) for r, row in enumerate(_rows(1, 3), 1)]
        + [("n.csv", r, *row, True) for r, row in enumerate(_rows(4, 2, "n"), 1)]
    )


DAYS = ["2026-01-01", "2026-01-02", "2026-01-03"]
BY_DAY = {"by": "time", "column": "seen_at", "start": "2026-01-01"}


@pytest.mark.parametrize("kind", ["duckdb", "postgres", "delta"])
@pytest.mark.parametrize("primary_key", [[], "id"], ids=["keyless", "keyed"])
def test_a_file_renamed_in_a_stream_partitioned_by_a_column_keeps_the_other_days_rows(
    kind: str, primary_key: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Every partition reads every file. A file renamed keeping its time: day 2's run retired all the old name's
    rows, those of days 1 and 3 too, which the new name holds but only their partitions read: missing, the run ok,
    until each of them ran again (the schedule runs only the newest). Now a partition retires its own day's rows."""
    from ingestion_assets_tests.files_helpers import target_catalog, target_of

    with target_of("postgres" if kind == "postgres" else "duckdb", tmp_path, request) as target:
        target_catalog(target, "*.csv", primary_key=primary_key, deletes="hard", partitions=BY_DAY)
        drops = target.drops
        lake = tmp_path / "lake"
        if kind == "delta":
            drops.use_destination({"type": "filesystem", "bucket_url": str(lake), "table_format": "delta"})
        text = "id,seen_at,v\n" + "".join(f"{i},{day}T01:00:00Z,v{i}\n" for i, day in enumerate(DAYS, 1))
        drops.write("a.csv", text, BASE)
        for day in DAYS:
            drops.run(day)
        (drops.folder / "a.csv").rename(drops.folder / "b.csv")

        def rows() -> list[tuple[Any, ...]]:
            if kind != "delta":
                return target.query("SELECT _ingest_file, id, v FROM drops.orders ORDER BY id, 1")
            from ingestion_assets_tests.destination_targets import lake_rows

            found = lake_rows("delta", str(lake / "drops" / "orders"), ["_ingest_file", "id", "v"], "id")
            return sorted(found, key=lambda r: (r[1], r[0]))

        drops.run(DAYS[1])
        assert rows() == [("a.csv", 1, "v1"), ("b.csv", 2, "v2"), ("a.csv", 3, "v3")]
        for day in (DAYS[0], DAYS[2]):
            drops.run(day)
        assert rows() == [("b.csv", 1, "v1"), ("b.csv", 2, "v2"), ("b.csv", 3, "v3")]
