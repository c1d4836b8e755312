"""CDC sources through Dagster on the embedded PostgreSQL 18: snapshot, changes under a concurrent writer,
deletes, key changes, TOAST, truncates, crashes, WAL gaps, slot health."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import dagster as dg
import psycopg2
import pytest

from ingestion_assets.sources.postgres.cdc import drop_slot, parse_lsn, slot_health
from ingestion_assets.sync import FAULT_ENV
from ingestion_assets_tests.helpers import StreamHarness

TABLE = """
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, amount numeric(12,2), note text,
                     updated_at timestamptz NOT NULL DEFAULT now());
INSERT INTO orders SELECT g, 'new', g * 1.5, CASE WHEN g % 50 = 0 THEN repeat(md5(g::text), 400) END,
                          timestamptz '2024-01-01 00:00:00+00' + g * interval '1 s'
FROM generate_series(1, 3000) g;
"""


@pytest.fixture
def cdc(harness: StreamHarness) -> Iterator[StreamHarness]:
    try:
        yield harness
    finally:
        drop_slot(harness.source.url, f"ingest_{harness.source_name}")  # a slot left behind hoards WAL
        harness.source.execute(f"DROP PUBLICATION IF EXISTS ingest_{harness.source_name}")


def _catalog(harness: StreamHarness, **stream: Any) -> None:
    harness.write_catalog(
        {"orders": {"table": "orders", "primary_key": "id", **stream}},
        mode="cdc",
        cdc={"max_changes": 400, "max_seconds": 2, "max_batches_per_run": 50, "retries": {"max_attempts": 1}},
    )


def _materialize(harness: StreamHarness, raise_on_error: bool = True) -> dg.ExecuteInProcessResult:
    return harness.materialize(raise_on_error=raise_on_error)


def _live_rows(harness: StreamHarness) -> list[tuple[Any, ...]]:
    columns = harness.source.columns("orders")
    return harness.target_rows_where("orders", columns, "id", "_ingest_deleted_at IS NULL")


def _assert_exact(harness: StreamHarness) -> None:
    assert _live_rows(harness) == harness.source.rows("orders", "id")


def test_snapshot_then_changes_under_a_concurrent_writer(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness, deletes="soft")
    stop = threading.Event()
    deleted: set[int] = set()

    def writer() -> None:
        rng = random.Random(7)
        conn = psycopg2.connect(harness.source.url)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'SET search_path = "{harness.source.schema}"')
            next_id = 10_000
            while not stop.is_set():
                kind = rng.random()
                key = rng.randint(1, 3000)
                if kind < 0.4:
                    cur.execute("UPDATE orders SET status = 'paid', amount = amount + 1 WHERE id = %s", (key,))
                elif kind < 0.55:
                    cur.execute("DELETE FROM orders WHERE id = %s", (key,))
                    deleted.add(key)
                elif kind < 0.65:
                    cur.execute("UPDATE orders SET id = id + 100000 WHERE id = %s", (key,))  # a key change
                elif kind < 0.75:
                    cur.execute("UPDATE orders SET status = 'toast-kept' WHERE id = %s AND note IS NOT NULL", (key,))
                else:
                    next_id += 1
                    cur.execute("INSERT INTO orders (id, status, amount) VALUES (%s, 'new', 1)", (next_id,))
                time.sleep(0.003)
        conn.close()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        first = _materialize(harness)  # the snapshot, while the writer keeps writing
        assert (
            first.asset_materializations_for_node(f"{harness.source_name}__cdc")[0].metadata["mode"].value == "snapshot"
        )
        for _ in range(3):
            _materialize(harness)
    finally:
        stop.set()
        thread.join()
    for _ in range(5):  # drain what the writer left
        result = _materialize(harness)
        metadata = result.asset_materializations_for_node(f"{harness.source_name}__cdc")[0].metadata
        if metadata["rows read"].value == 0:
            break
    _assert_exact(harness)
    tombstones = harness.query_target(
        f'SELECT count(*) FROM "{harness.source_name}".orders WHERE _ingest_deleted_at IS NOT NULL'
    )
    assert tombstones[0][0] >= 1  # soft deletes keep the row, flagged
    assert metadata["latency ms"].value == {} or set(metadata["latency ms"].value) == {"p50", "p95", "p99"}


def test_hard_deletes_key_changes_and_toast_are_exact(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness)
    _materialize(harness)
    harness.source.execute(
        """
        UPDATE orders SET id = 50000 WHERE id = 5;
        DELETE FROM orders WHERE id BETWEEN 100 AND 120;
        UPDATE orders SET status = 'shipped' WHERE id IN (50, 100, 150, 200);  -- TOASTed note unchanged
        INSERT INTO orders (id, status, amount, note) VALUES (70000, 'new', 0.01, repeat('x', 20000));
        UPDATE orders SET note = 'short now' WHERE id = 250;
        """
    )
    result = _materialize(harness)
    assert result.asset_materializations_for_node(f"{harness.source_name}__cdc")[0].metadata["mode"].value == "changes"
    tags = harness.instance.get_run_by_id(result.run_id).tags  # type: ignore[union-attr]
    assert tags["ingest/mode"] == "cdc" and tags["ingest/source"] == harness.source_name  # also without the job
    assert harness.query_target(
        f'SELECT count(*) FROM "{harness.source_name}".orders WHERE _ingest_deleted_at IS NOT NULL'
    ) == [(0,)]
    _assert_exact(harness)


@pytest.mark.parametrize("point", ["after_load", "before_load"])
def test_a_failure_around_the_load_never_lets_the_slot_pass_the_checkpoint(
    cdc: StreamHarness, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness)
    _materialize(harness)
    harness.source.execute("UPDATE orders SET status = 'x' WHERE id <= 900; DELETE FROM orders WHERE id > 2900")
    monkeypatch.setenv(FAULT_ENV, f"{point}:0")
    assert not _materialize(harness, raise_on_error=False).success
    checkpoint = harness.checkpoint("orders")
    assert checkpoint is not None and checkpoint.position is not None
    confirmed = slot_health(harness.source.url, f"ingest_{harness.source_name}").confirmed_flush_lsn or 0
    assert confirmed <= parse_lsn(checkpoint.position["lsn"])  # WAL released only behind the checkpoint
    monkeypatch.delenv(FAULT_ENV)
    _materialize(harness)
    _assert_exact(harness)


def test_a_sigkill_between_load_and_checkpoint_replays_harmlessly(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness)
    _materialize(harness)
    harness.source.execute("UPDATE orders SET amount = amount * 2 WHERE id % 3 = 0")
    process = harness.materialize_cli("orders", **{FAULT_ENV: "after_load:0:kill"})
    assert process.wait(timeout=180) != 0
    _materialize(harness)
    _assert_exact(harness)


@pytest.mark.parametrize("deletes", ["hard", "soft"])
def test_an_interrupted_snapshot_leaves_no_row_the_source_deleted_meanwhile(
    cdc: StreamHarness, monkeypatch: pytest.MonkeyPatch, deletes: str
) -> None:
    """Found while writing the chaos runs: the first copy died after some slices, rows it had loaded
    were deleted before the next copy's slot existed, so no change would ever remove them."""
    harness = cdc
    harness.source.execute(TABLE)
    harness.write_catalog(
        {"orders": {"table": "orders", "primary_key": "id", "deletes": deletes}},
        mode="cdc",
        cdc={"snapshot_slice_rows": 500, "retries": {"max_attempts": 1}},
    )
    monkeypatch.setenv(FAULT_ENV, "after_snapshot_slice:2")
    assert not _materialize(harness, raise_on_error=False).success
    assert harness.target_count("orders") == 1500
    monkeypatch.delenv(FAULT_ENV)
    harness.source.execute("DELETE FROM orders WHERE id <= 100 OR id % 7 = 0")
    _materialize(harness)
    _assert_exact(harness)
    gone = harness.query_target(
        f'SELECT count(*) FROM "{harness.source_name}".orders WHERE id <= 100 AND _ingest_deleted_at IS NOT NULL'
    )
    assert gone == [(100 if deletes == "soft" else 0,)]


def test_truncate_is_refused_or_applied_never_ignored(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness)
    _materialize(harness)
    harness.source.execute("TRUNCATE orders; INSERT INTO orders (id, status) VALUES (1, 'again')")
    result = _materialize(harness, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    assert "truncated" in str(failure.step_failure_data.error) and "truncate: apply" in str(
        failure.step_failure_data.error
    )
    _catalog(harness, truncate="apply")
    _materialize(harness)
    _assert_exact(harness)


def test_a_wal_gap_stops_the_stream_or_resyncs(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness)
    _materialize(harness)
    harness.source.execute("UPDATE orders SET status = 'lost?' WHERE id <= 10; DELETE FROM orders WHERE id > 2990")
    with psycopg2.connect(harness.source.url) as conn, conn.cursor() as cur:  # another consumer moved the slot
        cur.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (f"ingest_{harness.source_name}",))
    result = _materialize(harness, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    message = str(failure.step_failure_data.error)
    assert "can no longer deliver" in message and "on_wal_gap: resync" in message
    assert f"Re-copy the streams it concerns (`ingest state reset {harness.source_name}.orders`" in message
    harness.write_catalog(
        {"orders": {"table": "orders", "primary_key": "id"}},
        mode="cdc",
        cdc={"max_changes": 400, "max_seconds": 2, "on_wal_gap": "resync", "retries": {"max_attempts": 1}},
    )
    result = _materialize(harness)
    assert result.asset_materializations_for_node(f"{harness.source_name}__cdc")[0].metadata["mode"].value == "snapshot"
    _assert_exact(harness)


def test_a_table_without_a_key_is_reported_with_the_fix(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute("CREATE TABLE orders (id int, status text); INSERT INTO orders VALUES (1, 'a')")
    _catalog(harness)
    result = _materialize(harness, raise_on_error=False)
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    assert "REPLICA IDENTITY" in str(failure.step_failure_data.error)


def test_slot_health_is_measured_and_checked(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness)
    result = _materialize(harness)
    check = next(r for r in result.get_asset_check_evaluations() if r.check_name == "slot_health")
    assert check.passed and "retained WAL bytes" in check.metadata


TYPED = r"""
CREATE TABLE typed (id int PRIMARY KEY, r real, at timestamptz, day date, clock time, span interval, ints int[],
                    texts text[], uid uuid, nr numrange, amount numeric(10,2), blob bytea);
INSERT INTO typed VALUES
 (1, 3.4e38, 'infinity', '0044-03-15 BC', '24:00:00', '1 mon -2 days 00:00:01.5', '{1,NULL}',
  array['a b', 'x"y', NULL, 'NULL', 'back\slash'], 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '(1.5,2]', 1.25, '\x00ff'),
 (2, '-0', '-infinity', '12345-01-01', '00:00:00', '-1 years', '{}', '{}', NULL, 'empty', NULL, '\x');
"""


def test_the_log_lands_values_exactly_as_the_snapshot_does(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(TYPED)
    harness.write_catalog(
        {"typed": {"table": "typed", "primary_key": "id"}},
        mode="cdc",
        cdc={"max_changes": 400, "max_seconds": 2, "max_batches_per_run": 50, "retries": {"max_attempts": 1}},
    )
    _materialize(harness)  # rows 1 and 2 from the snapshot (COPY)
    harness.source.execute(
        "INSERT INTO typed SELECT id + 100, r, at, day, clock, span, ints, texts, uid, nr, amount, blob FROM typed;"
        "INSERT INTO typed (id, ints, amount) VALUES (103, '{{1},{2}}', 1), (104, '{5}', 'NaN')"
    )
    _materialize(harness)  # rows 101 to 104 from the log (pgoutput)
    columns = [c for c in harness.source.columns("typed") if c != "id"]
    listed = ", ".join(f'"{c}"::VARCHAR' for c in columns)
    rows = harness.query_target(f'SELECT id, {listed} FROM "{harness.source_name}".typed ORDER BY id')
    by_id = {row[0]: row[1:] for row in rows}
    assert sorted(by_id) == [1, 2, 101, 102]
    assert by_id[101] == by_id[1] and by_id[102] == by_id[2]
    assert by_id[1][:3] == ("3.4e+38", "infinity", "0044-03-15 (BC)")
    parked = dict(harness.query_target(f'SELECT record_key, error FROM "{harness.source_name}"._ingest_dead_letter'))
    assert sorted(parked) == ["103", "104"]
    assert "multi-dimensional" in parked["103"] and parked["104"].startswith("amount: NaN has no exact decimal value")
