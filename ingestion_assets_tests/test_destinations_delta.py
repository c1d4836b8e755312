"""Lake destinations: Delta and Iceberg tables merged on the key, equal to the source value by value; kills replay."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from deltalake import DeltaTable

from ingestion_assets.loading import lake_tables
from ingestion_assets.loading.bindings import TABLE as BINDINGS
from ingestion_assets.loading.bindings import Marker
from ingestion_assets.loading.lake_tables import LakeTables
from ingestion_assets.loading.sql_targets import RetypeRefused
from ingestion_assets.state.summary import request_refresh
from ingestion_assets.sync import FAULT_ENV
from ingestion_assets_tests.destination_targets import lake_rows, use_destination
from ingestion_assets_tests.files_helpers import Drops
from ingestion_assets_tests.helpers import StreamHarness

ORDERS = """
CREATE TABLE orders (
    id bigint PRIMARY KEY, "Customer Name" text, note text, amount numeric(12, 2), paid boolean, placed date,
    payload jsonb, blob bytea, score double precision, tags int[], updated_at timestamptz NOT NULL
);
INSERT INTO orders SELECT g, 'customer ' || g, CASE WHEN g % 3 = 0 THEN '' WHEN g % 3 = 1 THEN NULL ELSE 'ü ✓ ' || g END,
    g * 1.25, g % 2 = 0, date '2024-01-01' + g, jsonb_build_object('n', g), decode(lpad(to_hex(g), 8, '0'), 'hex'),
    CASE WHEN g = 7 THEN 'NaN'::float8 ELSE g / 7.0 END, ARRAY[g, NULL, 3],
    timestamptz '2024-01-01 00:00:00.123456+00' + g * interval '1 s'
FROM generate_series(1, 900) g;
"""
BASE = 1_700_000_000.0  # the drops' modified times
COLUMNS = ["id", "customer_name", "note", "amount", "paid", "placed", "payload", "blob", "score", "tags", "updated_at"]


FORMATS = ["delta", "iceberg"]


def _catalog(
    harness: StreamHarness, lake: Path, disposition: str = "merge", attempts: int = 4, table_format: str = "delta"
) -> str:
    harness.write_catalog(
        {
            "orders": {
                "table": "orders",
                "primary_key": "id",
                "cursor": "updated_at",
                "write_disposition": disposition,
                "slice_rows": 500,
                "retries": {"max_attempts": attempts, "delay_seconds": 0.1},
            }
        }
    )
    use_destination(harness, {"type": "filesystem", "bucket_url": str(lake), "table_format": table_format})
    return str(lake / harness.source_name / "orders")


def _assert_equal(harness: StreamHarness, url: str, table_format: str = "delta") -> None:
    expected = [(*row[:6], row[6], *row[7:]) for row in harness.source.rows("orders", "id")]
    actual = [(*row[:6], json.loads(row[6]), *row[7:]) for row in lake_rows(table_format, url, COLUMNS, "id")]
    assert len(actual) == len(expected)
    differ = [(e, a) for e, a in zip(expected, actual, strict=True) if e != a]
    assert not differ, f"first differences (source, target): {differ[:3]}"


@pytest.mark.parametrize("table_format", FORMATS)
def test_a_table_stream_merges_into_a_lake_table_value_for_value(
    harness: StreamHarness, tmp_path: Path, table_format: str
) -> None:
    harness.source.execute(ORDERS)
    url = _catalog(harness, tmp_path / "lake", table_format=table_format)
    harness.materialize()
    _assert_equal(harness, url, table_format)
    harness.source.execute(
        "UPDATE orders SET note = 'changed', amount = -1.5, tags = '{}', updated_at = now() WHERE id % 100 = 0;"
        "INSERT INTO orders VALUES (6000, 'new', 'A', 1, true, '2025-01-01', '{}', '\\x00', 0, NULL, now())"
    )
    harness.materialize()
    _assert_equal(harness, url, table_format)
    checkpoint = harness.checkpoint("orders")
    assert checkpoint is not None and checkpoint.details["target"]["where"] == f"{table_format}:{tmp_path / 'lake'}"
    bindings = DeltaTable(str(tmp_path / "lake" / harness.source_name / "_ingest_bindings")).to_pyarrow_table()
    assert bindings.column("seq").to_pylist() == [checkpoint.details["target"]["seq"]]
    if table_format == "iceberg":  # an Iceberg table (metadata and snapshots), not Parquet beside a Delta log
        assert (Path(url) / "metadata").is_dir() and not (Path(url) / "_delta_log").exists()


@pytest.mark.slow
@pytest.mark.parametrize("table_format", FORMATS)
def test_a_refresh_replaces_the_lake_table_in_one_commit(
    harness: StreamHarness, tmp_path: Path, table_format: str
) -> None:
    harness.source.execute(ORDERS)
    url = _catalog(harness, tmp_path / "lake", "replace", table_format=table_format)
    harness.materialize()
    harness.source.execute("DELETE FROM orders WHERE id <= 100; UPDATE orders SET note = 'renamed' WHERE id > 1100")
    harness.materialize()
    _assert_equal(harness, url, table_format)
    generations = {row[0] for row in lake_rows(table_format, url, ["_ingest_generation_id", "id"], "id")}
    assert generations == {2}
    assert sorted(p.name for p in (tmp_path / "lake" / harness.source_name).iterdir() if "refresh" in p.name) == []


@pytest.mark.slow
@pytest.mark.parametrize("table_format", FORMATS)
def test_a_kill_between_the_table_commit_and_the_checkpoint_replays_harmlessly(
    harness: StreamHarness, tmp_path: Path, table_format: str
) -> None:
    harness.source.execute(ORDERS)
    # the kill ends the run, no retry within it
    url = _catalog(harness, tmp_path / "lake", attempts=1, table_format=table_format)
    process = harness.materialize_cli("orders", **{FAULT_ENV: "after_load:1:kill"})
    assert process.wait(timeout=300) != 0
    checkpoint = harness.checkpoint("orders")
    assert checkpoint is not None and checkpoint.details["slice"] == 0  # slice 1 committed in the table, not here
    assert len(lake_rows(table_format, url, ["id"], "id")) == 900
    harness.source.execute("UPDATE orders SET note = 'after the kill', updated_at = now() WHERE id IN (10, 700)")
    harness.materialize()
    _assert_equal(harness, url, table_format)  # slice 1 read again, merged on the key: no duplicate, no gap


def _parquet_rows(url: str, columns: list[str]) -> list[dict[str, object]]:
    import pyarrow.dataset as pads

    files = sorted(str(p) for p in Path(url).rglob("*.parquet"))
    return pads.dataset(files, format="parquet").to_table(columns=columns).to_pylist() if files else []


@pytest.mark.slow
def test_plain_parquet_appends_every_version_and_a_refresh_replaces_the_files(
    harness: StreamHarness, tmp_path: Path
) -> None:
    harness.source.execute(ORDERS)
    url = _catalog(harness, tmp_path / "lake", "append", table_format="parquet")
    harness.materialize()
    harness.source.execute("UPDATE orders SET note = 'changed', updated_at = now() WHERE id % 100 = 0")
    harness.materialize()
    rows = _parquet_rows(url, ["id", "note", "_ingest_position"])
    assert len(rows) == 900 + 9  # the updated rows once more, as their new version
    newest: dict[object, dict[str, object]] = {}
    for row in sorted(rows, key=lambda r: (r["id"], r["_ingest_position"])):  # type: ignore[arg-type]
        newest[row["id"]] = row
    assert [(k, r["note"]) for k, r in sorted(newest.items())] == [  # type: ignore[type-var]
        (r[0], r[2]) for r in harness.source.rows("orders", "id")
    ]
    url = _catalog(harness, tmp_path / "lake", "replace", table_format="parquet")
    harness.source.execute("DELETE FROM orders WHERE id <= 100")
    harness.materialize()
    replaced = _parquet_rows(url, ["id", "note"])
    assert sorted((r["id"], r["note"]) for r in replaced) == [(r[0], r[2]) for r in harness.source.rows("orders", "id")]  # type: ignore[type-var]


def test_streams_recording_their_bindings_at_once_never_fail_on_each_others_commits(tmp_path: Path) -> None:
    """Every stream of a lake dataset records its binding in one shared Delta table: streams of one source
    loading at once made each other's commits fail ("concurrent transaction", "protocol changed"), reported
    as permanent (found by the files and lakes attack)."""
    tables = LakeTables(str(tmp_path), {}, local=True)
    errors: list[BaseException] = []

    def stream(index: int) -> None:
        for seq in range(4):
            try:
                tables.write_marker(f"s{index}", None, Marker("binding", seq, 1))
                tables.delete(BINDINGS, f"stream = 'gone{index}'")
            except Exception as exc:  # noqa: BLE001 - every failure is the finding
                errors.append(exc)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    markers = [tables.read_marker(f"s{i}", None) for i in range(6)]
    assert [marker.seq if marker else None for marker in markers] == [3] * 6



def test_a_sync_forces_the_newest_commits_never_a_temporary_file_of_another_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sync after a commit forced the last two names of the Delta log by name order: a concurrent writer's
    temporary commit file (renamed away meanwhile: FileNotFoundError failed the run, CI saw it) and
    `_last_checkpoint` sort after every commit, so the commit just made was not the one forced."""
    tables = LakeTables(str(tmp_path), {}, local=True)
    for seq in range(3):
        tables.write_marker("s", None, Marker("binding", seq, 1))
    log_dir = tmp_path / BINDINGS / "_delta_log"
    (log_dir / "_commit_0a1b.json.tmp").write_text("{}")
    (log_dir / "_last_checkpoint").write_text("{}")
    forced: list[str] = []
    real_open = open

    def watching(path: str, *args: object, **kwargs: object) -> object:
        forced.append(os.path.basename(path))
        if path.endswith(".tmp"):
            raise FileNotFoundError(2, "No such file or directory", path)  # renamed by its writer meanwhile
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(lake_tables, "open", watching, raising=False)
    tables.sync(BINDINGS)
    assert forced[-1] == "00000000000000000002.json" and not any(name.startswith("_") for name in forced)


EXTREMES = """
CREATE TABLE events (id int PRIMARY KEY, day date, at timestamptz, local timestamp, updated_at timestamptz NOT NULL);
INSERT INTO events SELECT g, date '2024-01-01' + g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 h',
    timestamp '2024-01-01 00:00:00' + g * interval '1 h', timestamptz '2024-01-01 00:00:00+00' + g * interval '1 s'
FROM generate_series(1, 20) g;
UPDATE events SET day = 'infinity' WHERE id = 3;
UPDATE events SET day = '0044-03-15 BC' WHERE id = 4;
UPDATE events SET at = '-infinity' WHERE id = 5;
UPDATE events SET local = 'infinity' WHERE id = 6;
UPDATE events SET at = '10000-01-01 00:00:00+00' WHERE id = 7;
"""


@pytest.mark.parametrize("table_format", ["delta", pytest.param("iceberg", marks=pytest.mark.slow)])
def test_dates_a_lake_cannot_hold_are_parked_and_the_rest_loads(
    harness: StreamHarness, tmp_path: Path, table_format: str
) -> None:
    """infinity, BC and the year 10000 made Delta's writer panic and pyiceberg fail: the whole stream stopped
    as a permanent error naming no column (found by the files and lakes attack). They are parked instead."""
    harness.source.execute(EXTREMES)
    harness.write_catalog({"events": {"table": "events", "primary_key": "id", "cursor": "updated_at"}})
    use_destination(harness, {"type": "filesystem", "bucket_url": str(tmp_path / "lake"), "table_format": table_format})
    result = harness.materialize()
    url = str(tmp_path / "lake" / harness.source_name / "events")
    landed = lake_rows(table_format, url, ["id", "day", "at", "local"], "id")
    assert [row[0] for row in landed] == [i for i in range(1, 21) if i not in (3, 4, 5, 6, 7)]
    expected = harness.query_source(
        f'SELECT id, day, at, local FROM "{harness.source.schema}".events WHERE id NOT IN (3, 4, 5, 6, 7) ORDER BY id'
    )
    assert [tuple(row) for row in landed] == expected
    metadata = result.asset_materializations_for_node(f"{harness.source_name}__events")[0].metadata
    assert metadata["dead letters"].value == 5
    parked = DeltaTable(str(tmp_path / "lake" / harness.source_name / "_ingest_dead_letter")).to_pyarrow_table()
    errors = dict(zip(parked.column("record_key").to_pylist(), parked.column("error").to_pylist(), strict=True))
    assert sorted(errors) == ["3", "4", "5", "6", "7"]
    assert "column day" in errors["3"] and "years 1-9999" in errors["3"] and "column at" in errors["7"]


def _take_back(url: str, table_format: str) -> None:
    """What an operator does with the format's own time travel: the table back at its first version."""
    if table_format == "delta":
        DeltaTable(url).restore(0)
        return
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("restore", uri="sqlite:///:memory:", warehouse=f"file://{url}")
    catalog.create_namespace("lake")
    metadata = sorted((Path(url) / "metadata").glob("*.metadata.json"))[-1]
    table = catalog.register_table(("lake", "orders"), str(metadata))
    first = min(table.metadata.snapshots, key=lambda snapshot: snapshot.sequence_number or 0)
    table.manage_snapshots().rollback_to_snapshot(first.snapshot_id).commit()


@pytest.mark.parametrize("table_format", ["delta", pytest.param("iceberg", marks=pytest.mark.slow)])
def test_a_lake_table_taken_back_with_its_own_time_travel_is_read_again(
    harness: StreamHarness, tmp_path: Path, table_format: str
) -> None:
    """Only the stream's table goes back (Delta RESTORE, an Iceberg rollback), not the bindings beside it: the
    run carried on from its checkpoint and 11 rows were missing, 100 stale (found by the files and lakes
    attack). The checkpoint records the table's version; a table taken back before it is read again."""
    harness.source.execute(ORDERS)
    url = _catalog(harness, tmp_path / "lake", table_format=table_format)
    harness.materialize()
    harness.source.execute(
        "UPDATE orders SET note = 'second', updated_at = now() WHERE id <= 100;"
        "INSERT INTO orders VALUES (6000, 'new', 'A', 1, true, '2025-01-01', '{}', '\\x00', 0, NULL, now())"
    )
    harness.materialize()
    _take_back(url, table_format)
    harness.source.execute("UPDATE orders SET note = 'third', updated_at = now() WHERE id BETWEEN 500 AND 509")
    result = harness.materialize()
    _assert_equal(harness, url, table_format)
    materialization = result.asset_materializations_for_node(f"{harness.source_name}__orders")[0]
    reason = materialization.metadata["started over"].value
    assert "no longer holds what the checkpoint describes" in str(reason)


@pytest.mark.parametrize("table_format", ["delta", pytest.param("iceberg", marks=pytest.mark.slow)])
def test_a_refresh_after_a_widening_rebuilds_the_lake_table_in_the_new_type(tmp_path: Path, table_format: str) -> None:
    """A lake table's column is not retyped in place, and the run says to refresh; the refresh then failed with
    the same RetypeRefused (its shadow table, made by the first slice in the old type, met the new type in a later
    slice; Iceberg's swap could not promote bigint to text either), so the stream was stuck (found by the
    README-only attack). The refresh now rebuilds its shadow in the new type and swaps it in with that type."""
    drops = Drops(tmp_path)
    drops.catalog(path="*.csv", primary_key="id", files_per_slice=1)  # one file per slice: the shadow exists
    url = str(tmp_path / "lake")
    drops.use_destination({"type": "filesystem", "bucket_url": url, "table_format": table_format})
    drops.write("1.csv", "id,code\n1,10\n", BASE + 1)
    drops.run()
    drops.write("2.csv", "id,code\n2,X-2\n", BASE + 2)
    with pytest.raises(RetypeRefused, match="bigint -> text"):
        drops.run()
    latest = drops.store.latest(None)
    assert latest is not None
    drops.store.commit(None, latest.position, generation=latest.details["generation"], refresh_requested="remove")
    assert drops.run().generation == 2
    drops.write("3.csv", "id,code\n3,Y-3\n1,11\n", BASE + 3)
    drops.run()
    table = f"{url}/drops/orders"
    assert lake_rows(table_format, table, ["id", "code"], "id") == [(1, "11"), (2, "X-2"), (3, "Y-3")]


@pytest.mark.slow
def test_a_refresh_of_a_table_stream_after_a_widening_swaps_in_the_new_type(
    harness: StreamHarness, tmp_path: Path
) -> None:
    """Iceberg's swap merged the shadow's schema into the table's and could not promote integer to text."""
    harness.source.execute(
        "CREATE TABLE items (id int PRIMARY KEY, code int, updated_at timestamptz NOT NULL DEFAULT now());"
        "INSERT INTO items (id, code) SELECT g, g FROM generate_series(1, 5) g"
    )
    harness.write_catalog({"items": {"table": "items", "primary_key": "id", "cursor": "updated_at"}})
    lake = tmp_path / "lake"
    use_destination(harness, {"type": "filesystem", "bucket_url": str(lake), "table_format": "iceberg"})
    harness.materialize()
    harness.source.execute("ALTER TABLE items ALTER COLUMN code TYPE text; UPDATE items SET code = 'X-1' WHERE id = 1")
    assert not harness.materialize(raise_on_error=False).success  # RetypeRefused: refresh the stream
    request_refresh(harness.settings, harness.source_name, "items", "remove")
    harness.materialize()
    rows = lake_rows("iceberg", str(lake / harness.source_name / "items"), ["id", "code"], "id")
    assert rows == [(1, "X-1"), *((i, str(i)) for i in range(2, 6))]
