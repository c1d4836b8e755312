"""Backfills as partitions: key ranges and time windows, in parallel, resumable inside a window, with
live changes arriving beside them."""

from __future__ import annotations

import datetime as dt
import threading
import time

import dagster as dg
import duckdb
import pytest

from ingestion_assets.catalog import load_catalog
from ingestion_assets.observe.status import stream_statuses
from ingestion_assets.partitions import LIVE
from ingestion_assets.sync import FAULT_ENV
from ingestion_assets_tests.helpers import StreamHarness

ROWS = 20_000
ORDERS = f"""
CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, amount numeric(12,2),
                     updated_at timestamptz NOT NULL);
CREATE INDEX ON orders (updated_at, id);
INSERT INTO orders SELECT g, 'new', g * 0.5, now() - interval '70 hours' + (g % 4000) * interval '1 minute'
FROM generate_series(1, {ROWS}) g;
"""


def _key_catalog(harness: StreamHarness, **extra: object) -> None:
    harness.write_catalog(
        {
            "orders": {
                "table": "orders",
                "primary_key": "id",
                "cursor": "updated_at",
                "slice_rows": 1_500,
                "partitions": {"by": "key", "chunk": 5_000},
                "retries": {"max_attempts": 1},
                **extra,
            }
        },
        max_concurrency=4,
    )


def _rows_read(harness: StreamHarness, result: object) -> int:
    node = f"{harness.source_name}__orders"
    return int(result.asset_materializations_for_node(node)[0].metadata["rows read"].value)  # type: ignore[attr-defined]


def _snapshot(harness: StreamHarness) -> list[tuple[object, ...]]:
    with duckdb.connect(str(harness.warehouse), read_only=True) as con:
        return con.execute(f'SELECT * FROM "{harness.source_name}".orders ORDER BY id').fetchall()


def test_key_ranges_backfill_in_parallel_processes_and_rerun_changes_nothing(harness: StreamHarness) -> None:
    harness.source.execute(ORDERS)
    _key_catalog(harness)
    keys = harness.plan_partitions("orders")
    assert keys == ["0-4999", "5000-9999", "10000-14999", "15000-19999", "20000-24999", LIVE]

    first = harness.materialize_cli("orders", "--partition-range", "0-4999...10000-14999")
    second = harness.materialize_cli("orders", "--partition-range", "15000-19999...20000-24999")
    harness.wait_ok(first, second)
    harness.materialize(partition=LIVE)
    assert harness.assert_target_equals_source("orders", "orders", "id") == ROWS
    for key in keys[:-1]:
        checkpoint = harness.checkpoint("orders", key)
        assert checkpoint is not None and checkpoint.details["complete"] is True

    before = _snapshot(harness)
    for key in keys:  # nothing changed in the source: every partition reads nothing and writes nothing
        assert _rows_read(harness, harness.materialize(partition=key)) == 0
    assert _snapshot(harness) == before


def test_a_backfill_of_many_partitions_in_one_run(harness: StreamHarness) -> None:
    harness.source.execute(ORDERS)
    _key_catalog(harness)
    harness.plan_partitions("orders")
    result = harness.materialize(partition_range=("0-4999", "20000-24999"))
    assert _rows_read(harness, result) == ROWS
    assert harness.assert_target_equals_source("orders", "orders", "id") == ROWS


def test_a_partition_killed_mid_window_resumes_inside_it(harness: StreamHarness) -> None:
    harness.source.execute(ORDERS)
    _key_catalog(harness)
    harness.plan_partitions("orders")
    harness.materialize(partition_range=("0-4999", "10000-14999"))
    done = {k: harness.checkpoint("orders", k) for k in ("0-4999", "5000-9999", "10000-14999")}

    killed = harness.materialize_cli("orders", "--partition", "15000-19999", **{FAULT_ENV: "after_checkpoint:1:kill"})
    assert killed.wait(timeout=180) != 0
    inside = harness.checkpoint("orders", "15000-19999")
    assert inside is not None and inside.details["complete"] is False and inside.details["slice"] == 1
    assert {k: harness.checkpoint("orders", k) for k in done} == done  # the others kept their progress
    (status,) = stream_statuses(harness.settings, load_catalog(harness.settings.catalog_path), harness.instance)
    assert {p.partition: p.complete for p in status.partitions} == {  # what `ingest status` lists
        LIVE: True,  # planned with the ranges: it starts where the history was first planned
        "0-4999": True,
        "5000-9999": True,
        "10000-14999": True,
        "15000-19999": False,
    }

    resumed = harness.materialize(partition="15000-19999")
    assert _rows_read(harness, resumed) == 5_000 - 2 * 1_500  # only the rest of its window
    harness.materialize(partition="20000-24999")
    assert harness.assert_target_equals_source("orders", "orders", "id") == ROWS


def test_time_partitions_backfill_while_rows_change_and_the_newest_partition_keeps_up(harness: StreamHarness) -> None:
    """Partitioned on the cursor: an update moves a row into the newest window. Old windows read
    before the update may load the old version after the new one landed: the merge keeps the newest."""
    harness.source.execute(ORDERS)
    start = (dt.datetime.now(dt.UTC) - dt.timedelta(days=3)).date()
    harness.write_catalog(
        {
            "orders": {
                "table": "orders",
                "primary_key": "id",
                "cursor": "updated_at",
                "slice_rows": 700,
                "partitions": {"by": "time", "column": "updated_at", "start": start.isoformat()},
                "retries": {"max_attempts": 1},
            }
        }
    )
    days = [(start + dt.timedelta(days=i)).isoformat() for i in range(4)]
    stop = threading.Event()
    updates = {"count": 0}

    def writer() -> None:
        while not stop.is_set():
            harness.source.execute(
                "UPDATE orders SET status = 'changed', amount = amount + 1, updated_at = clock_timestamp() "
                "WHERE id IN (SELECT id FROM orders ORDER BY random() LIMIT 25)"
            )
            updates["count"] += 1
            time.sleep(0.02)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        older = harness.materialize_cli("orders", "--partition-range", f"{days[0]}...{days[1]}")
        newer = harness.materialize_cli("orders", "--partition-range", f"{days[2]}...{days[3]}")
        harness.wait_ok(older, newer)
    finally:
        stop.set()
        thread.join()
    assert updates["count"] > 10
    harness.materialize(partition=days[3])  # the schedule's newest-partition run after the backfill
    assert harness.assert_target_equals_source("orders", "orders", "id") == ROWS


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_an_older_version_arriving_later_never_overwrites_a_newer_one(
    harness: StreamHarness, destination: str, tmp_path: object
) -> None:
    """The loader's version guard, against a real target: live lands v2, the history chunk brings v1."""
    import pyarrow as pa

    from ingestion_assets.catalog import Destination, Reference
    from ingestion_assets.loading.metadata_columns import with_metadata
    from ingestion_assets.loading.pipeline import Loader, TargetTable

    if destination == "postgres":
        url_file = harness.tmp_path / "warehouse_url"
        url_file.write_text(harness.source.url)
        target = Destination(type="postgres", credentials=Reference(file=str(url_file)))
        dataset = f"{harness.source.schema}_wh"
    else:
        target = Destination(type="duckdb", path=str(harness.warehouse))
        dataset = harness.source_name
    harness.write_catalog({"x": {"table": "x", "primary_key": "id"}})
    loader = Loader(
        settings=harness.settings,
        destination=target,
        target=TargetTable(dataset, "versions", ("id",), "merge"),
        pipeline_name=f"guard_{destination}_{harness.source_name}",
        guard_versions=True,
    )

    def rows(version: dt.datetime, ids: list[int], label: str) -> pa.Table:
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "label": pa.array([label] * len(ids)),
                "updated_at": pa.array([version] * len(ids), pa.timestamp("us", tz="UTC")),
            }
        )
        return with_metadata(table, ["updated_at"], dt.datetime.now(dt.UTC), 1)

    old, new = dt.datetime(2024, 1, 1, tzinfo=dt.UTC), dt.datetime(2024, 6, 1, tzinfo=dt.UTC)
    assert loader.load(rows(new, [1, 2, 3], "v2")) == 3  # the live tail lands the update first
    assert loader.load(rows(old, [1, 2, 3, 4], "v1")) == 1  # the history chunk: only id 4 is not stale
    assert loader.load(rows(new, [3], "v2-again")) == 1  # equal version: a replay is applied
    with loader._pipeline.sql_client() as client:
        found = client.execute_sql(f"SELECT id, label FROM {client.make_qualified_table_name('versions')} ORDER BY id")
    assert [tuple(r) for r in found] == [(1, "v2"), (2, "v2"), (3, "v2-again"), (4, "v1")]


def test_a_range_over_key_ranges_planned_after_live_refuses_instead_of_taking_in_live(harness: StreamHarness) -> None:
    """Found by a README-only attack: ranges planned after `live` follow it in the partition list, so
    `--partition-range FIRST...LAST` over key ranges read the live tail too, and recorded it materialized.
    Such a range now fails at once naming the ranges to run; a range ending at the last range before `live`, or
    naming `live` as its end, runs."""
    harness.source.execute(ORDERS)
    _key_catalog(harness)
    assert harness.plan_partitions("orders")[-1] == LIVE
    harness.source.execute(
        "INSERT INTO orders SELECT g, 'new', 1, now() FROM generate_series(20001, 26000) g"
    )
    assert harness.plan_partitions("orders")[-2:] == [LIVE, "25000-29999"]  # planned after `live`
    refused = harness.materialize(partition_range=("15000-19999", "25000-29999"), raise_on_error=False)
    assert not refused.success
    failure = next(e for e in refused.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    message = failure.step_failure_data.error.message
    assert "15000-19999...25000-29999 takes in `live`" in message
    assert "run 15000-19999...20000-24999 and 25000-29999...25000-29999, and `live` by itself" in message
    assert harness.checkpoint("orders", "15000-19999") is None
    # It read nothing: `ingest status` showed the stream and the range's last partition `failed` (a README-only
    # attack); they are as they were, and the refused run is named apart.
    (line,) = stream_statuses(harness.settings, load_catalog(harness.catalog_path), harness.instance)
    assert line.status != "failed" and line.partition_summary and not line.partition_summary.failed, line
    assert line.refused_run and "the partition range 15000-19999...25000-29999 takes in `live`" in line.refused_run
    assert harness.materialize(partition_range=("15000-19999", "20000-24999")).success
    assert harness.materialize(partition_range=("20000-24999", LIVE)).success  # named: taken in
    assert harness.materialize(partition_range=("25000-29999", "25000-29999")).success
    assert not harness.materialize(partition_range=("15000-19999", "25000-29999"), raise_on_error=False).success
    (line,) = stream_statuses(harness.settings, load_catalog(harness.catalog_path), harness.instance)
    assert line.status == "partly loaded" and line.partition_summary and not line.partition_summary.failed, line
    assert line.partition_summary.materialized == 4 and line.refused_run, line
    assert "3 partition(s) never run (0-4999, 5000-9999, 10000-14999)" in line.detail, line

