"""A files stream's dead letters on every kind of target: listed and replayed on MariaDB (whose reserved
`partition` must be quoted) and on a Delta lake (read through deltalake, no DuckDB extension); released when
a fixed file is read again by a normal run; parked safely whatever value they hold."""

from __future__ import annotations

import datetime as dt
import gzip
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ingestion_assets.loading.parked import UnknownDeadLetters, discard_parked, parked_rows
from ingestion_assets.streams.files_replay import replay_file_dead_letters
from ingestion_assets.streams.postgres_table import Target
from ingestion_assets_tests.destination_targets import MariaDb, mariadb
from ingestion_assets_tests.files_helpers import Drops

__all__ = ["mariadb"]
BASE = 1_700_000_000.0


@pytest.fixture
def drops(tmp_path: Path) -> Drops:
    return Drops(tmp_path)


def _target(drops: Drops, destination: dict[str, Any]) -> None:
    catalog = yaml.safe_load(drops.settings.catalog_path.read_text())
    catalog["destination"] = destination
    drops.settings.catalog_path.write_text(yaml.safe_dump(catalog))


def _destination(kind: str, drops: Drops, request: pytest.FixtureRequest) -> dict[str, Any]:
    if kind == "mariadb":
        db: MariaDb = request.getfixturevalue("mariadb")
        db.datasets.append("drops")
        return db.destination()
    return {"type": "filesystem", "bucket_url": str(drops.root / "lake"), "table_format": kind}


def _parked(drops: Drops, run_ids: set[str] | None = None) -> list[str]:
    stream = drops.stream()
    rows = parked_rows(stream.loader(Target(stream.name, 1), None))
    if run_ids is not None:
        run_ids.update(row["run_id"] for row in rows)
    return [row["record_key"] for row in rows]


# MariaDB's listing (its quoted `partition`) is in the default suite through the year-10000 test below
SLOW = pytest.mark.slow


@pytest.mark.parametrize("kind", [pytest.param("mariadb", marks=SLOW), "delta", pytest.param("iceberg", marks=SLOW)])
def test_dead_letters_are_listed_and_replayed(kind: str, drops: Drops, request: pytest.FixtureRequest) -> None:
    drops.catalog(path="*.csv", primary_key="id", csv={"column_types": {"amount": "float64"}})
    _target(drops, _destination(kind, drops, request))
    drops.write("a.csv", "id,name,amount\n1,a,1.5\n2,b,oops\n", BASE)
    drops.run()
    assert _parked(drops) == ["a.csv:row2"]
    drops.write("a.csv", "id,name,amount\n1,a,1.5\n2,b,2.0\n", BASE)
    details = drops.store.latest(None).details  # type: ignore[union-attr]
    replay = replay_file_dead_letters(drops.stream(), int(details["generation"]), dict(details))
    assert (replay.parked, replay.released, replay.loaded, replay.still_bad, replay.gone) == (1, 1, 2, 0, [])
    assert _parked(drops) == []


def test_a_fixed_file_read_again_releases_its_dead_letters(drops: Drops) -> None:
    drops.catalog(path="*.csv*", primary_key="id", csv={"column_types": {"amount": "float64"}})
    drops.write("b.csv", "id,name,amount\n1,a,oops\n2,b,2.5\n3,c\n", BASE)
    drops.write("t.csv.gz", gzip.compress(b"id,name,amount\n7,g,1.0\n8,h,2.0\n")[:-12], BASE)
    drops.write("k.csv", "id,name,amount\n9,i,nope\n", BASE)
    drops.run()
    assert [k for k, _ in drops.dead_letters()] == ["b.csv:line4", "b.csv:row1", "k.csv:row1", "t.csv.gz:file"]
    drops.write("b.csv", "id,name,amount\n1,a,1.0\n2,b,2.5\n3,c,3.0\n", BASE + 10)  # fixed: rewritten
    drops.write("t.csv.gz", gzip.compress(b"id,name,amount\n7,g,1.0\n8,h,2.0\n"), BASE + 10)
    drops.run()
    assert [k for k, _ in drops.dead_letters()] == ["k.csv:row1"]  # not read again: still parked
    assert [r[0] for r in drops.rows()] == [1, 2, 3, 7, 8]


def test_a_timestamp_past_year_9999_is_parked_not_fatal(drops: Drops, mariadb: MariaDb) -> None:
    drops.catalog(path="*.parquet", primary_key="id")
    mariadb.datasets.append("drops")
    _target(drops, mariadb.destination())
    values = [
        dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        dt.datetime(999, 1, 1, tzinfo=dt.UTC),
        dt.datetime(2024, 1, 2, tzinfo=dt.UTC),
    ]
    table = pa.table({"id": [1, 2, 3], "at": pa.array(values, pa.timestamp("us"))})
    big = pa.array([253_402_387_200_000_000], pa.int64()).cast(pa.timestamp("us"))  # 10000-01-02
    pq.write_table(pa.concat_tables([table, pa.table({"id": [4], "at": big})]), drops.folder / "a.parquet")
    drops.run()  # the run fails (raises) when parking a row fails
    runs: set[str] = set()
    assert sorted(_parked(drops, runs)) == ["2", "4"]
    assert runs == {"test"}  # `ingest dlq list` says which run parked them (it was empty)
    assert [r[0] for r in mariadb.rows("drops", "orders", ["id"], "id")] == [1, 3]


@pytest.mark.parametrize("kind", [pytest.param("mariadb", marks=SLOW), "delta", pytest.param("iceberg", marks=SLOW)])
def test_dead_letters_are_discarded_by_key_under_the_writer_lock(
    kind: str, drops: Drops, request: pytest.FixtureRequest
) -> None:
    """`ingest dlq discard` goes through the release path a load takes (SQL on MariaDB, the Delta API on a lake):
    a dry run removes nothing, an unknown key removes nothing, the named keys leave and the others stay."""
    drops.catalog(path="*.csv", primary_key="id", csv={"column_types": {"amount": "float64"}})
    _target(drops, _destination(kind, drops, request))
    drops.write("a.csv", "id,name,amount\n1,a,1.5\n2,b,oops\n3,c,nope\n4,d,bad\n", BASE)
    drops.run()
    assert _parked(drops) == ["a.csv:row2", "a.csv:row3", "a.csv:row4"]
    stream = drops.stream()
    loader = stream.loader(Target(stream.name, 1), None)
    dry = discard_parked(loader, ["a.csv:row2"], apply=False)
    assert [row["record_key"] for row in dry] == ["a.csv:row2"] and "oops" in dry[0]["error"]
    with pytest.raises(UnknownDeadLetters) as unknown:
        discard_parked(loader, ["a.csv:row3", "a.csv:row9"], apply=True)
    assert unknown.value.args == (["a.csv:row9"], 3)
    assert _parked(drops) == ["a.csv:row2", "a.csv:row3", "a.csv:row4"]
    gone = discard_parked(loader, ["a.csv:row2", "a.csv:row4"], apply=True)
    assert sorted(row["record_key"] for row in gone) == ["a.csv:row2", "a.csv:row4"]
    assert _parked(drops) == ["a.csv:row3"]
    assert [row["record_key"] for row in discard_parked(loader, None, apply=True)] == ["a.csv:row3"]
    assert _parked(drops) == [] and discard_parked(loader, None, apply=True) == []


def test_a_discard_waits_for_a_load_that_holds_the_writer_lock(drops: Drops) -> None:
    """The look at the dead letters and their delete are one hold of the stream's writer lock: a load running
    meanwhile (which parks and releases) finishes first."""
    drops.catalog(path="*.csv", primary_key="id", csv={"column_types": {"amount": "float64"}})
    _target(drops, {"type": "filesystem", "bucket_url": str(drops.root / "lake"), "table_format": "delta"})
    drops.write("a.csv", "id,name,amount\n1,a,oops\n", BASE)
    drops.run()
    stream = drops.stream()
    loading, discarding = (stream.loader(Target(stream.name, 1), None) for _ in range(2))
    events: list[str] = []
    worker = threading.Thread(target=lambda: events.append(str(len(discard_parked(discarding, None, apply=True)))))
    with loading.held():
        worker.start()
        worker.join(0.5)
        assert worker.is_alive()  # waiting for the lock
        events.append("load done")
    worker.join(60)
    assert events == ["load done", "1"] and _parked(drops) == []
