"""API records and files into MariaDB: a field whose numbers grow past int64 or become text widens its column in
place (as on DuckDB and PostgreSQL), in a normal run and in a refresh, every value kept exactly; a NUL is parked with
a reason that names the destination."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pymysql
import pytest

from ingestion_assets.loading import pipeline
from ingestion_assets.state.summary import request_refresh
from ingestion_assets_tests.destination_targets import MARIADB, MariaDb, mariadb, use_destination
from ingestion_assets_tests.files_helpers import Drops
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.rest.scripted import ScriptedApi, write_scripted_catalog

__all__ = ["mariadb"]

Start = Callable[..., ScriptedApi]
PAST_INT64 = 12345678901234567890123  # 23 digits: DECIMAL(23,0)
PAST_DECIMAL = 10**44 + 7  # 45 digits: past an exact decimal here, only text holds it


def _catalog(harness: StreamHarness, api: ScriptedApi, mariadb: MariaDb, **settings: Any) -> None:
    stream: dict[str, Any] = {
        **settings,
        "path": "/feed",
        "primary_key": "id",
        "cursor": "seq",
        "cursor_param": "since",
        "page_size": 2,
        "pages_per_slice": 1,
        "retries": {"max_attempts": 1},
    }
    write_scripted_catalog(harness, api, "feed", stream)
    use_destination(harness, mariadb.destination())
    mariadb.datasets.append(harness.source_name)


def _row(key: int, big: Any) -> dict[str, Any]:
    return {"id": key, "seq": key, "big": big}


def _big(mariadb: MariaDb, harness: StreamHarness, table: str = "feed") -> dict[int, Any]:
    return dict(mariadb.query(f"SELECT id, big FROM `{harness.source_name}`.`{table}` ORDER BY id"))


def _column_type(mariadb: MariaDb, harness: StreamHarness, table: str = "feed") -> str:
    ((kind,),) = mariadb.query(
        "SELECT column_type FROM information_schema.columns "
        f"WHERE table_schema = '{harness.source_name}' AND table_name = '{table}' AND column_name = 'big'"
    )
    return str(kind).lower()


def test_a_field_past_int64_then_text_widens_its_mariadb_column_in_place(
    harness: StreamHarness, scripted_api: Start, mariadb: MariaDb
) -> None:
    """It failed with "column 'big' changed type bigint -> numeric(23,0) ... refresh the stream" on every run."""
    api = scripted_api(feed=[[_row(1, 5), _row(2, -(2**63))]])
    _catalog(harness, api, mariadb)
    assert harness.materialize().success
    assert _column_type(mariadb, harness) == "bigint(20)"
    api.feed = [[_row(3, PAST_INT64)]]
    assert harness.materialize().success
    assert _column_type(mariadb, harness) == "decimal(23,0)"
    assert _big(mariadb, harness) == {1: Decimal(5), 2: Decimal(-(2**63)), 3: Decimal(PAST_INT64)}
    api.feed = [[_row(4, PAST_DECIMAL)], [_row(5, "X-5")]]
    assert harness.materialize().success
    assert _column_type(mariadb, harness) == "longtext"
    assert _big(mariadb, harness) == {1: "5", 2: str(-(2**63)), 3: str(PAST_INT64), 4: str(PAST_DECIMAL), 5: "X-5"}
    parked = mariadb.query(
        "SELECT count(*) FROM information_schema.tables "
        f"WHERE table_schema = '{harness.source_name}' AND table_name = '_ingest_dead_letter'"
    )
    assert parked == [(0,)]  # no value parked: every one loaded


def test_a_refresh_whose_later_slice_widens_a_field_loads_it_on_mariadb(
    harness: StreamHarness, scripted_api: Start, mariadb: MariaDb
) -> None:
    """The refresh's table took the first slice as bigint, and the wider numbers of the next slice failed it on
    `<table>_refresh_g2` every time: the refresh the error named was a dead end."""
    api = scripted_api(feed=[[_row(1, 5), _row(2, 6)]])
    _catalog(harness, api, mariadb)
    assert harness.materialize().success
    request_refresh(harness.settings, harness.source_name, "feed", "remove")
    api.feed = [[_row(1, 5), _row(2, 6)], [_row(3, PAST_INT64)], [_row(4, "text now")]]
    assert harness.materialize().success
    assert _big(mariadb, harness) == {1: "5", 2: "6", 3: str(PAST_INT64), 4: "text now"}
    generations = mariadb.query(f"SELECT DISTINCT _ingest_generation_id FROM `{harness.source_name}`.feed")
    assert generations == [(2,)]


def test_a_change_mariadb_cannot_make_in_place_names_a_refresh_and_the_refresh_loads_it(
    harness: StreamHarness, scripted_api: Start, mariadb: MariaDb
) -> None:
    """A boolean field that becomes a number (applied: policy propagate) is no widening: the run fails, its
    checkpoint kept, naming a refresh; the refresh reads the stream again into a new table of the new type."""
    api = scripted_api(feed=[[_row(1, True), _row(2, False)]])
    _catalog(harness, api, mariadb, schema_policy="propagate")
    assert harness.materialize().success
    api.feed = [[_row(3, 7)]]
    failed = harness.materialize(raise_on_error=False)
    assert not failed.success
    message = str(failed.all_events)
    assert "does not change these column types" in message and "ingest refresh" in message
    assert _big(mariadb, harness) == {1: 1, 2: 0}  # nothing changed
    request_refresh(harness.settings, harness.source_name, "feed", "remove")
    api.feed = [[_row(1, 1), _row(2, 0)], [_row(3, 7)]]  # the API's field is a number now, in every record
    assert harness.materialize().success
    assert _big(mariadb, harness) == {1: 1, 2: 0, 3: 7}
    assert _column_type(mariadb, harness) == "bigint(20)"


def test_a_nul_parked_on_mariadb_names_mariadb(harness: StreamHarness, scripted_api: Start, mariadb: MariaDb) -> None:
    api = scripted_api(feed=[[{"id": 1, "seq": 1, "name": "a"}, {"id": 2, "seq": 2, "name": "b\x00c"}]])
    _catalog(harness, api, mariadb)
    assert harness.materialize().success
    ((error,),) = mariadb.query(f"SELECT error FROM `{harness.source_name}`._ingest_dead_letter")
    assert "['name'] hold a NUL character" in error and "MariaDB" in error
    assert "DuckDB" not in error and "PostgreSQL" not in error


def test_a_file_column_past_int64_then_text_widens_its_mariadb_column_in_place(
    tmp_path: Path, mariadb: MariaDb
) -> None:
    drops = _drops_on(mariadb, tmp_path, path="*.csv", primary_key="id")
    drops.write("w1.csv", "id,amount\n1,5\n2,-6\n", 1_700_000_000)
    drops.run()
    drops.write("w2.csv", f"id,amount\n3,{PAST_INT64}\n", 1_700_000_100)
    drops.run()
    assert dict(mariadb.query("SELECT id, amount FROM drops.orders")) == {
        1: Decimal(5),
        2: Decimal(-6),
        3: Decimal(PAST_INT64),
    }
    drops.write("w3.csv", "id,amount\n4,abc\n", 1_700_000_200)
    drops.run()
    rows = dict(mariadb.query("SELECT id, amount FROM drops.orders"))
    assert rows == {1: "5", 2: "-6", 3: str(PAST_INT64), 4: "abc"}


def test_a_table_column_widened_at_the_source_widens_in_mariadb(harness: StreamHarness, mariadb: MariaDb) -> None:
    """A PostgreSQL table's int4 made bigint and numeric(10,2) made numeric(30,2): refused before on MariaDB."""
    harness.source.execute(
        "CREATE TABLE w (id int PRIMARY KEY, n int, amount numeric(10,2), updated_at timestamptz NOT NULL);"
        "INSERT INTO w VALUES (1, 5, 1.25, now()), (2, -7, 99999999.99, now())"
    )
    harness.write_catalog({"w": {"table": "w", "primary_key": "id", "cursor": "updated_at"}})
    use_destination(harness, mariadb.destination())
    mariadb.datasets.append(harness.source_name)
    assert harness.materialize().success
    harness.source.execute(
        "ALTER TABLE w ALTER COLUMN n TYPE bigint, ALTER COLUMN amount TYPE numeric(30,2);"
        "INSERT INTO w VALUES (3, 9223372036854775807, 1234567890123456789012345678.91, now())"
    )
    assert harness.materialize().success
    expected = [row[:3] for row in harness.source.rows("w", "id")]
    assert mariadb.rows(harness.source_name, "w", ["id", "n", "amount"], "id") == expected
    assert [row[2] for row in expected] == [
        Decimal("1.25"),
        Decimal("99999999.99"),
        Decimal("1234567890123456789012345678.91"),
    ]


def test_a_key_field_that_becomes_text_widens_its_indexed_mariadb_column(
    harness: StreamHarness, scripted_api: Start, mariadb: MariaDb
) -> None:
    """The key is indexed (its first 255 characters when text): a LONGTEXT column needs the prefix."""
    api = scripted_api(feed=[[{"id": 1, "seq": 1, "v": "a"}, {"id": 2, "seq": 2, "v": "b"}]])
    _catalog(harness, api, mariadb)
    assert harness.materialize().success
    api.feed = [[{"id": "A-3", "seq": 3, "v": "c"}, {"id": 2, "seq": 4, "v": "b2"}]]
    assert harness.materialize().success
    rows = mariadb.query(f"SELECT id, v FROM `{harness.source_name}`.feed ORDER BY id")
    assert rows == [("1", "a"), ("2", "b2"), ("A-3", "c")]


def test_a_refresh_swaps_in_the_nested_tables_with_their_root_on_mariadb(
    harness: StreamHarness, scripted_api: Start, mariadb: MariaDb
) -> None:
    """A record's list lands in `feed__tags`; before, a refresh swapped in `feed` alone: the old children stayed,
    tied to no row, and the new generation's were left in `feed_refresh_g2__tags` (recheck25b)."""
    api = scripted_api(feed=[[{**_row(k, k), "tags": [f"a{k}", f"b{k}"]} for k in (1, 2)]])
    _catalog(harness, api, mariadb)
    assert harness.materialize().success
    api.feed = [[{**_row(k, k), "tags": [f"a{k}", f"b{k}"]} for k in (1, 2, 3)]]
    request_refresh(harness.settings, harness.source_name, "feed", "remove")
    assert harness.materialize().success
    schema = harness.source_name
    joined = mariadb.query(
        f"SELECT f.id, t.value FROM `{schema}`.`feed__tags` t JOIN `{schema}`.`feed` f ON t._dlt_parent_id = f._dlt_id "
        "ORDER BY f.id, t.value"
    )
    assert [(int(k), v) for k, v in joined] == [(k, f"{p}{k}") for k in (1, 2, 3) for p in "ab"]
    ((held,),) = mariadb.query(f"SELECT count(*) FROM `{schema}`.`feed__tags`")
    assert held == 6
    left = mariadb.query(
        f"SELECT table_name FROM information_schema.tables WHERE table_schema = '{schema}' "
        "AND table_name LIKE '%refresh%'"
    )
    assert left == []


LONG_TEXT = "y" * 70_000  # past TEXT's 64 KiB


def _drops_on(mariadb: MariaDb, tmp_path: Path, **catalog: Any) -> Drops:
    """A files source `drops` with one stream (`catalog`: its settings) loading into MariaDB."""
    drops = Drops(tmp_path)
    drops.catalog(**catalog)
    drops.use_destination(mariadb.destination())
    mariadb.datasets.append("drops")
    return drops


def _file_rows(mariadb: MariaDb, columns: str = "id, amount") -> list[tuple[Any, ...]]:
    return [tuple(str(v) for v in row) for row in mariadb.query(f"SELECT {columns} FROM drops.orders ORDER BY 1, 2")]


def test_each_file_partition_widens_the_mariadb_column_another_partition_created(
    tmp_path: Path, mariadb: MariaDb
) -> None:
    """A partition's checkpoint keeps a schema of its own: the target's column, created by another partition, is
    known by the type MariaDB holds. It was unknown there (MariaDB's catalog was not read), so partition 2's
    numbers past int64 went into the BIGINT column as a new one's and every run failed with "Out of range value
    for column 'amount'"."""
    partitions = {"by": "time", "pattern": "dt={date}/", "start": "2026-01-01", "granularity": "daily"}
    drops = _drops_on(mariadb, tmp_path, path="**/*.csv", primary_key="id", partitions=partitions)
    drops.write("dt=2026-01-01/a.csv", "id,amount\n1,5\n2,-6\n", 1_700_000_000)
    drops.write("dt=2026-01-02/b.csv", f"id,amount\n3,{PAST_INT64}\n", 1_700_000_100)
    drops.run("2026-01-01")
    drops.run("2026-01-02")
    assert _file_rows(mariadb) == [("1", "5"), ("2", "-6"), ("3", str(PAST_INT64))]


@pytest.mark.slow  # several loads: beyond the default suite's time budget
def test_a_keyless_file_stream_with_deletes_widens_on_mariadb_while_no_session_of_its_own_holds_the_table(
    tmp_path: Path, mariadb: MariaDb, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that reads the target (its files, stale rows, dead letters), deletes rows of a gone file and of a
    shortened one, parks a bad row and widens a column twice, in slices of one file: every ALTER gets the table's
    metadata lock at once (a session of the run left in a transaction would hold it: the ALTER would wait)."""
    monkeypatch.setattr(pipeline, "MYSQL_ALTER_WAIT_SECONDS", 3)
    drops = _drops_on(mariadb, tmp_path, path="*.csv", deletes="hard", files_per_slice=1)
    drops.write("a.csv", "id,amount\n1,5\n2,6\n", 1_700_000_000)
    drops.write("z.csv", "id,amount\n9,9\n", 1_700_000_050)
    drops.run()
    (drops.folder / "z.csv").unlink()
    drops.write("a.csv", "id,amount\n1,7\n", 1_700_000_100)  # shorter: its row 2 goes
    drops.write("b.csv", f"id,amount\n3,{PAST_INT64}\n4,1,2\n", 1_700_000_200)  # a row of the wrong width
    drops.write("c.csv", f"id,amount\n5,{LONG_TEXT}\n", 1_700_000_300)
    outcome = drops.run()
    assert outcome.result.dead_letters == 1
    assert _file_rows(mariadb) == [("1", "7"), ("3", str(PAST_INT64)), ("5", LONG_TEXT)]


def test_a_widening_waiting_on_another_sessions_transaction_names_that_session(
    tmp_path: Path, mariadb: MariaDb, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ALTER failed after its wait with MariaDB's bare "Lock wait timeout exceeded; try restarting
    transaction", naming neither the lock nor who held it."""
    monkeypatch.setattr(pipeline, "MYSQL_ALTER_WAIT_SECONDS", 2)
    drops = _drops_on(mariadb, tmp_path, path="*.csv", primary_key="id")
    drops.write("a.csv", "id,amount\n1,5\n", 1_700_000_000)
    drops.run()
    reader = pymysql.connect(**MARIADB, autocommit=False)  # a BI tool's session, left in its transaction
    try:
        with reader.cursor() as cur:
            cur.execute("SELECT count(*) FROM drops.orders")
            cur.fetchall()
            session = reader.thread_id()
        drops.write("b.csv", f"id,amount\n2,{PAST_INT64}\n", 1_700_000_100)
        with pytest.raises(Exception, match=r"metadata lock") as failed:
            drops.run()
        message = str(failed.value)
        assert f"session {session} (root@" in message and "sleep for" in message
        assert "a connection of this very process" in message  # the test's session is in this process
    finally:
        reader.close()
    drops.run()  # the session is gone: the checkpoint was kept, the file loads now
    assert _file_rows(mariadb) == [("1", "5"), ("2", str(PAST_INT64))]
