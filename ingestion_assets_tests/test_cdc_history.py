"""CDC history as Dagster backfill partitions (`cdc.history_chunk`): key-range chunks copied while the log
runs on (embedded PostgreSQL 18; snapshot visibility also on the server INGEST_TEST_PG_URL names)."""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import dagster as dg
import psycopg2
import pytest
from pydantic import ValidationError

from ingestion_assets.catalog import PostgresSource
from ingestion_assets.partitions import LIVE
from ingestion_assets.sources.postgres.cdc import drop_slot, parse_lsn, slot_health
from ingestion_assets.sources.postgres.cdc.chunks import ChunkSnapshot, chunk_snapshot
from ingestion_assets.state.checkpoints import latest_checkpoint
from ingestion_assets.sync import FAULT_ENV
from ingestion_assets_tests.helpers import SourceDb, StreamHarness

TABLE = """
CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, amount numeric(12,2), note text);
INSERT INTO orders SELECT g, 'new', g * 1.5, CASE WHEN g % 50 = 0 THEN repeat(md5(g::text), 400) END
FROM generate_series(1, 3000) g;
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL);
INSERT INTO customers SELECT g, 'c' || g FROM generate_series(500, 1499) g;
"""
RANGES = ["0-999", "1000-1999", "2000-2999", "3000-3999"]


@pytest.fixture
def cdc(harness: StreamHarness) -> Iterator[StreamHarness]:
    try:
        yield harness
    finally:
        drop_slot(harness.source.url, f"ingest_{harness.source_name}")
        harness.source.execute(f"DROP PUBLICATION IF EXISTS ingest_{harness.source_name}")


def _catalog(harness: StreamHarness, deletes: str = "hard") -> None:
    harness.write_catalog(
        {
            "orders": {"table": "orders", "primary_key": "id", "deletes": deletes},
            "customers": {"table": "customers", "primary_key": "id", "deletes": deletes},
        },
        mode="cdc",
        cdc={
            "history_chunk": 1000,
            "snapshot_slice_rows": 300,
            "max_changes": 5000,
            "max_seconds": 2,
            "retries": {"max_attempts": 1},
        },
    )
    harness.instance.add_dynamic_partitions(_partitions(harness), [LIVE])  # what `ingest partitions plan` does


def _partitions(harness: StreamHarness) -> str:
    return f"{harness.source_name}__cdc"


def _run(harness: StreamHarness, partition: str, raise_on_error: bool = True) -> dg.ExecuteInProcessResult:
    return harness.materialize(partition=partition, raise_on_error=raise_on_error)


def _metadata(result: dg.ExecuteInProcessResult, harness: StreamHarness) -> dict[str, Any]:
    materializations = result.asset_materializations_for_node(f"{harness.source_name}__cdc")
    return {k: v.value for k, v in materializations[0].metadata.items()}


def _assert_exact(harness: StreamHarness) -> None:
    for table in ("orders", "customers"):
        columns = harness.source.columns(table)
        live = harness.target_rows_where(table, columns, "id", "_ingest_deleted_at IS NULL")
        assert live == harness.source.rows(table, "id"), table


def _writer(source: SourceDb, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    conn = psycopg2.connect(source.url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'SET search_path = "{source.schema}"')
        next_id = 10_000
        while not stop.is_set():
            kind, key = rng.random(), rng.randint(1, 3000)
            if kind < 0.35:
                cur.execute("UPDATE orders SET status = 'paid', amount = amount + 1 WHERE id = %s", (key,))
            elif kind < 0.5:
                cur.execute("DELETE FROM orders WHERE id = %s", (key,))
            elif kind < 0.58:
                cur.execute("UPDATE orders SET id = id + 100000 WHERE id = %s", (key,))  # leaves every range
            elif kind < 0.64:
                cur.execute("UPDATE orders SET id = %s WHERE id = %s", (rng.randint(3001, 3999), key))  # into a range
            elif kind < 0.7:
                cur.execute("UPDATE orders SET status = 'toast-kept' WHERE id = %s AND note IS NOT NULL", (key,))
            elif kind < 0.8:
                cur.execute("UPDATE customers SET name = name || '+' WHERE id = %s", (rng.randint(500, 1499),))
            elif kind < 0.85:
                cur.execute("DELETE FROM customers WHERE id = %s", (rng.randint(500, 1499),))
            else:
                next_id += 1
                cur.execute("INSERT INTO orders (id, status, amount) VALUES (%s, 'new', 1)", (next_id,))
            time.sleep(0.004)
    conn.close()


def _write_safely(source: SourceDb, stop: threading.Event, seed: int) -> None:
    while not stop.is_set():  # a key move onto an existing key fails; the writer starts again
        try:
            _writer(source, stop, seed)
        except psycopg2.errors.UniqueViolation:
            seed += 1


# soft: slow (the same machinery as hard; soft deletes into history ranges are also in the simulation's seeds)
@pytest.mark.parametrize("deletes", ["hard", pytest.param("soft", marks=pytest.mark.slow)])
def test_history_partitions_under_a_concurrent_writer_end_exact(cdc: StreamHarness, deletes: str) -> None:
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness, deletes)
    started = _run(harness, LIVE)  # creates the slot and plans the history ranges; copies nothing
    assert _metadata(started, harness)["mode"] == "changes"
    # nothing copied (the warehouse file may exist: the run bound each stream to it)
    assert not harness.query_target_if_exists(f'SELECT * FROM "{harness.source_name}".orders')
    planned = harness.instance.get_dynamic_partitions(_partitions(harness))
    assert planned == [LIVE, *RANGES]  # only ranges holding rows: customers' 500-1499 add none
    stop = threading.Event()
    thread = threading.Thread(target=_write_safely, args=(harness.source, stop, 11 if deletes == "hard" else 12))
    thread.start()
    try:
        concurrent = harness.materialize_cli(f"orders,{harness.source_name}/customers", "--partition", LIVE)
        for key in planned[1:]:
            chunk = _metadata(_run(harness, key), harness)
            assert chunk["mode"] == "chunk" and "ingest/checkpoint" not in chunk
            _run(harness, LIVE)
        harness.wait_ok(concurrent)
    finally:
        stop.set()
        thread.join()
    for _ in range(6):
        if _metadata(_run(harness, LIVE), harness)["rows read"] == 0:
            break
    _assert_exact(harness)
    checkpoint = latest_checkpoint(harness.instance, dg.AssetKey([harness.source_name, "orders"]), LIVE)
    assert checkpoint is not None and checkpoint.details["history"] == {"chunk": 1000, "buckets": [0, 1, 2, 3]}
    confirmed = slot_health(harness.source.url, f"ingest_{harness.source_name}").confirmed_flush_lsn or 0
    assert confirmed <= parse_lsn(checkpoint.position["lsn"])  # WAL released only behind the checkpoint


def test_a_transaction_the_chunk_does_not_see_keeps_its_rows(
    cdc: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction running while the chunk's snapshot is taken commits right after it: its update and its
    delete must win over the chunk's older rows (they are fenced: the log has them)."""
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness)
    _run(harness, LIVE)
    held = psycopg2.connect(harness.source.url)
    with held.cursor() as cur:
        cur.execute(f'SET search_path = "{harness.source.schema}"')
        cur.execute("UPDATE orders SET status = 'late', amount = -1 WHERE id = 5")
        cur.execute("DELETE FROM orders WHERE id = 6")
        cur.execute("UPDATE orders SET id = 3500 WHERE id = 7")  # a key leaving the range

    import ingestion_assets.streams.cdc.copying as cdc_module

    real = cdc_module.chunk_snapshot

    @contextlib.contextmanager
    def commit_after_snapshot(url: str) -> Iterator[ChunkSnapshot]:
        with real(url) as snap:
            held.commit()  # after the snapshot was taken, so the snapshot does not see it
            yield snap

    monkeypatch.setattr(cdc_module, "chunk_snapshot", commit_after_snapshot)
    try:
        _run(harness, "0-999")
    finally:
        held.close()
    rows = dict(harness.query_target(f'SELECT id, status FROM "{harness.source_name}".orders WHERE id < 1000'))
    assert rows[5] == "late" and 6 not in rows and 7 not in rows
    assert rows == dict(harness.query_source("SELECT id, status FROM orders WHERE id < 1000"))


def test_the_snapshot_knows_which_transactions_it_sees(any_source_db: SourceDb) -> None:
    source_db = any_source_db
    before, during = psycopg2.connect(source_db.url), psycopg2.connect(source_db.url)
    try:
        with before.cursor() as cur:
            cur.execute("SELECT txid_current()")
            committed = cur.fetchone()[0]
        before.commit()
        with during.cursor() as cur:
            cur.execute("SELECT txid_current()")
            running = cur.fetchone()[0]
        with chunk_snapshot(source_db.url) as snap:
            during.commit()
            with before.cursor() as cur:
                cur.execute("SELECT txid_current()")
                later = cur.fetchone()[0]
            before.commit()
        assert snap.sees(committed % 2**32)
        assert not snap.sees(running % 2**32)
        assert not snap.sees(later % 2**32)
    finally:
        before.close()
        during.close()


def test_visibility_survives_xid_wraparound() -> None:
    epoch = 5 << 32
    snap = ChunkSnapshot("s", xmin=epoch - 10, xmax=epoch + 3, in_progress=frozenset({epoch - 2}), lsn=0)
    assert snap.sees((epoch - 20) % 2**32)  # before xmin, in the previous epoch's numbering
    assert snap.sees((epoch - 1) % 2**32)
    assert not snap.sees((epoch - 2) % 2**32)  # running when the snapshot was taken
    assert not snap.sees((epoch + 3) % 2**32) and not snap.sees((epoch + 1000) % 2**32)


def test_a_chunk_that_died_mid_copy_is_exact_after_its_retry(
    cdc: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness)
    _run(harness, LIVE)
    monkeypatch.setenv(FAULT_ENV, "after_snapshot_slice:1")
    assert not _run(harness, "1000-1999", raise_on_error=False).success
    monkeypatch.delenv(FAULT_ENV)
    harness.source.execute("DELETE FROM orders WHERE id BETWEEN 1000 AND 1100; UPDATE orders SET status = 'x'")
    for key in RANGES:
        _run(harness, key)
    _run(harness, LIVE)
    _assert_exact(harness)


@pytest.mark.slow
def test_a_dropped_publication_copies_every_stream_again_in_live(cdc: StreamHarness) -> None:
    """The operator dropped the product's publication: every stream lost its position, and the `live` run took
    that for a first run (a new slot, the ranges planned again, all of them materialized already), so the
    changes made meanwhile never arrived, rc 0. The tables are now copied again in `live`, saying why."""
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness)
    _run(harness, LIVE)
    for key in RANGES:
        _run(harness, key)
    harness.source.execute(f"DROP PUBLICATION ingest_{harness.source_name}")
    harness.source.execute(
        "DELETE FROM orders WHERE id BETWEEN 10 AND 20; UPDATE orders SET status = 'late' WHERE id > 2900;"
        "INSERT INTO customers VALUES (5000, 'new'); DELETE FROM customers WHERE id = 600"
    )
    result = _run(harness, LIVE)
    assert "was not in the publication" in _metadata(result, harness)["copy reason"]
    _assert_exact(harness)


def test_history_chunks_need_one_key_and_no_resync() -> None:
    base: dict[str, Any] = {"type": "postgres", "connection": {"env": "X"}, "mode": "cdc"}
    with pytest.raises(ValidationError, match="composite keys"):
        PostgresSource.model_validate(
            {**base, "cdc": {"history_chunk": 10}, "streams": {"t": {"table": "t", "primary_key": ["a", "b"]}}}
        )
    with pytest.raises(ValidationError, match="on_wal_gap"):
        PostgresSource.model_validate(
            {
                **base,
                "cdc": {"history_chunk": 10, "on_wal_gap": "resync"},
                "streams": {"t": {"table": "t", "primary_key": "a"}},
            }
        )


def test_a_killed_chunk_run_frees_the_slot_and_its_retry_is_exact(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness)
    _run(harness, LIVE)
    harness.source.execute("UPDATE orders SET status = 'before-kill' WHERE id % 4 = 0")
    both = f"orders,{harness.source_name}/customers"
    killed = harness.materialize_cli(both, "--partition", "0-999", **{FAULT_ENV: "after_snapshot_slice:0:kill"})
    assert killed.wait(timeout=300) != 0
    assert 0 < harness.target_count("orders") < 999  # one slice of the range landed, then the process died
    harness.source.execute("DELETE FROM orders WHERE id BETWEEN 1 AND 400 AND id % 3 = 0; UPDATE orders SET amount = 0")
    for key in RANGES:  # the first one takes the slot the killed run held
        _run(harness, key)
    _run(harness, LIVE)
    _assert_exact(harness)


def test_the_sensor_and_plan_start_history_partitions(cdc: StreamHarness) -> None:
    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.cli.state import plan_cdc_history
    from ingestion_assets.defs.cdc import build_cdc_assets

    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness)
    harness.instance.delete_dynamic_partition(_partitions(harness), LIVE)
    catalog = load_catalog(harness.catalog_path)
    sensor = build_cdc_assets(harness.settings, catalog)[1][0]
    request = sensor(dg.build_sensor_context(instance=harness.instance))
    assert isinstance(request, dg.RunRequest) and request.partition_key == LIVE
    assert harness.instance.get_dynamic_partitions(_partitions(harness)) == [LIVE]
    assert plan_cdc_history(harness.settings, catalog, harness.instance, None) == [(harness.source_name, [])]
    _run(harness, LIVE)  # starts the log and plans the ranges
    harness.instance.delete_dynamic_partition(_partitions(harness), "2000-2999")
    assert plan_cdc_history(harness.settings, catalog, harness.instance, None) == [(harness.source_name, ["2000-2999"])]
    harness.source.execute("UPDATE orders SET status = 'x' WHERE id = 1")
    waiting = sensor(dg.build_sensor_context(instance=harness.instance))
    assert isinstance(waiting, dg.RunRequest) and waiting.partition_key == LIVE


def test_several_versions_of_a_new_row_in_one_batch_end_at_the_newest(cdc: StreamHarness) -> None:
    """Found by the simulation (seeds 2002, 2004): a batch whose keys were all new was appended whole, so an
    insert and its update stayed as two rows, and an insert outlived its own delete."""
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness)
    _run(harness, LIVE)
    harness.source.execute("INSERT INTO orders (id, status) VALUES (5000, 'new'), (5001, 'new')")
    harness.source.execute("UPDATE orders SET status = 'paid' WHERE id = 5000")
    harness.source.execute("DELETE FROM orders WHERE id = 5001")
    _run(harness, LIVE)
    rows = harness.query_target(f'SELECT id, status FROM "{harness.source_name}".orders ORDER BY id')
    assert rows == [(5000, "paid")]


@pytest.mark.slow  # ~35 s: a WAL gap's message and reset are in test_cdc_streams.py; this adds the ranges again
def test_after_a_wal_gap_a_reset_and_the_ranges_again_end_exact(cdc: StreamHarness) -> None:
    from ingestion_assets.state.checkpoints import reset_checkpoint

    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness)
    _run(harness, LIVE)
    for key in RANGES:
        _run(harness, key)
    harness.source.execute("UPDATE orders SET status = 'lost?' WHERE id <= 10; DELETE FROM orders WHERE id > 2990")
    with psycopg2.connect(harness.source.url) as conn, conn.cursor() as cur:  # another consumer moved the slot
        cur.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (f"ingest_{harness.source_name}",))
    result = _run(harness, LIVE, raise_on_error=False)
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    assert "can no longer deliver" in str(failure.step_failure_data.error)
    assert "--partition live" in str(failure.step_failure_data.error)
    for stream in ("orders", "customers"):
        reset_checkpoint(harness.instance, dg.AssetKey([harness.source_name, stream]), LIVE, reason="test")
    _run(harness, LIVE)  # a new slot
    for key in RANGES:  # each range also removes what the source deleted during the gap
        _run(harness, key)
    _assert_exact(harness)


def test_a_cli_backfill_of_history_ranges_runs_them_in_one_run(cdc: StreamHarness) -> None:
    """`dagster asset materialize --partition-range` over history ranges failed inside Dagster (CheckError):
    the CDC asset now has a single-run backfill policy and copies each range of the run in turn."""
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness)
    _run(harness, LIVE)  # creates the slot and plans the ranges
    both = f"orders,{harness.source_name}/customers"  # materialize_cli puts the source before the first
    harness.wait_ok(harness.materialize_cli(both, "--partition-range", f"{RANGES[0]}...{RANGES[-1]}"))
    harness.source.execute("UPDATE orders SET status = 'after' WHERE id % 7 = 0")
    _run(harness, LIVE)
    _assert_exact(harness)


@pytest.mark.slow  # ~24 s: a live run of a history source
def test_schema_show_reads_a_history_source_s_live_checkpoint(
    cdc: StreamHarness, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its schema lives on `live`, where `ingest schema show` did not look ("no schema stored yet")."""
    from ingestion_assets.cli import main

    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness)
    _run(harness, LIVE)
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["schema", "show", f"{harness.source_name}.orders"]) == 0
    shown = capsys.readouterr().out
    assert "status" in shown and "no schema stored yet" not in shown
    assert main(["state", "show", f"{harness.source_name}.orders"]) == 0  # `live` has a checkpoint: not "never"
    shown = capsys.readouterr().out
    assert LIVE in shown and "never" not in shown


def test_status_counts_history_partitions_and_names_the_failed_chunk(
    cdc: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A history chunk that failed left its streams `ok` in `ingest status`: it is counted and named now."""
    from ingestion_assets.cli import main

    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness)
    _run(harness, LIVE)  # starts the log and plans the ranges
    monkeypatch.setenv(FAULT_ENV, "after_snapshot_slice:1")
    assert not _run(harness, "1000-1999", raise_on_error=False).success
    monkeypatch.delenv(FAULT_ENV)
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["status", "--json"]) == 1
    lines = json.loads(capsys.readouterr().out)
    assert {line["stream"].rsplit(".", 1)[1] for line in lines} == {"orders", "customers"}
    for line in lines:
        assert line["status"] == "failed" and "partition 1000-1999 failed" in line["detail"], line
        summary = line["partition_summary"]
        assert summary == {
            "total": 5,
            "materialized": 1,
            "failed": ["1000-1999"],
            "running": [],
            "missing": 3,
            "never_run": ["0-999", "2000-2999", "3000-3999"],
        }


@pytest.mark.slow  # ~30 s: the refresh runs `dagster asset materialize --partition live` as the CLI does
def test_refresh_of_a_stream_of_a_history_source_copies_it_in_a_live_run(
    cdc: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ingest refresh` failed with Dagster's DagsterInvalidSubsetError for a CDC stream; in a history source it
    resets the stream's `live` position and runs `live`, which copies that stream's table again."""
    import duckdb

    from ingestion_assets.cli import main

    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness)
    _run(harness, LIVE)
    for key in RANGES:
        _run(harness, key)
    with duckdb.connect(str(harness.warehouse)) as con:  # a target changed outside the product
        con.execute(f"UPDATE \"{harness.source_name}\".customers SET name = 'tampered' WHERE id < 600")
    harness.source.execute("UPDATE orders SET status = 'paid' WHERE id % 9 = 0")
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["refresh", f"{harness.source_name}.customers"]) == 0
    assert "the table's copy beside the log is complete" in capsys.readouterr().out
    _assert_exact(harness)


@pytest.mark.slow  # ~30 s: several runs of a history source
def test_reset_and_accept_of_a_history_source_stream_act_on_its_live_checkpoint(
    cdc: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ingest schema accept STREAM` (the command a pause names) said "has never run" and `ingest state reset
    STREAM` reset a checkpoint nothing reads: a history source keeps its streams' checkpoints on `live`."""
    from ingestion_assets.cli import main

    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness)
    _run(harness, LIVE)
    for key in RANGES:
        _run(harness, key)
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    harness.source.execute("ALTER TABLE customers ALTER COLUMN name TYPE int USING length(name)")
    failure = next(e for e in _run(harness, LIVE, False).all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    assert f"ingest schema accept {harness.source_name}.customers" in str(failure.step_failure_data.error)
    assert main(["schema", "accept", f"{harness.source_name}.customers"]) == 0
    _run(harness, LIVE)
    _assert_exact(harness)
    assert main(["state", "reset", f"{harness.source_name}.orders"]) == 0
    harness.source.execute("UPDATE orders SET status = 'after' WHERE id % 7 = 0")
    materializations = _run(harness, LIVE).asset_materializations_for_node(f"{harness.source_name}__cdc")
    orders = next(m for m in materializations if m.asset_key == harness.key("orders"))
    assert orders.metadata["copied"].value is True
    _assert_exact(harness)
