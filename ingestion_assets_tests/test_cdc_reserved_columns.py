"""A table whose column is named like one of the product's own (`_ingest_position`, `_dlt_id`, ...) cannot land in
the target: in a CDC source that stream alone is refused, before its table is published or any of its changes
is read, naming the stream, the table and the column; the source's other streams go on and lose nothing.
On the embedded PostgreSQL and a DuckDB file."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from ingestion_assets.catalog import load_catalog
from ingestion_assets.checks import check_catalog
from ingestion_assets.sync import Faults
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.test_cdc_real_schemas import FAST, _metadata
from ingestion_assets_tests.test_cdc_streams import cdc

__all__ = ["cdc"]  # the fixture that drops the slot and publication a test leaves

TABLES = """
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL);
INSERT INTO orders SELECT g, 'new' FROM generate_series(1, 20) g;
CREATE TABLE events (id int PRIMARY KEY, kind text, _ingest_position text);
INSERT INTO events SELECT g, 'k', 'p' || g FROM generate_series(1, 10) g;
"""


def _catalog(harness: StreamHarness, *names: str) -> None:
    streams: dict[str, Any] = {n: {"table": n, "primary_key": "id"} for n in names}
    harness.write_catalog(streams, mode="cdc", cdc=FAST)


def _published(harness: StreamHarness) -> list[str]:
    publication = f"ingest_{harness.source_name}"
    rows = harness.query_source(f"SELECT tablename::text FROM pg_publication_tables WHERE pubname = '{publication}'")
    return sorted(r[0] for r in rows)


def _orders_exact(harness: StreamHarness) -> None:
    target = harness.target_rows_where("orders", ["id", "status"], "id", "_ingest_deleted_at IS NULL")
    assert target == harness.source.rows("orders", "id")


def test_a_reserved_column_in_the_first_run_refuses_its_stream_alone(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(TABLES)
    _catalog(harness, "orders", "events")
    result = harness.materialize(raise_on_error=False)
    assert result.success
    said = _metadata(result, harness, "events")["paused"]
    assert f"stream {harness.source_name}.events" in said and "_ingest_position" in said and "events" in said
    assert _published(harness) == ["orders"]
    _orders_exact(harness)
    (problem,) = check_catalog(harness.settings, load_catalog(harness.settings.catalog_path))  # `ingest check`
    assert f"{harness.source_name}.events" in problem and "'_ingest_position'" in problem and "view" not in problem
    harness.source.execute("UPDATE orders SET status = 'paid' WHERE id < 5; DELETE FROM orders WHERE id = 9")
    harness.materialize()
    _orders_exact(harness)


def test_any_column_under_the_products_prefix_refuses_its_stream(cdc: StreamHarness) -> None:
    """`_ingest_cdc_op` and `_ingest_lsn` were copied and streamed: only the names the product writes were refused."""
    harness = cdc
    harness.source.execute(
        TABLES.replace("_ingest_position text", "_ingest_cdc_op text, _ingest_lsn text").replace("'p' || g", "'a', 'b'")
    )
    _catalog(harness, "orders", "events")
    result = harness.materialize()
    said = _metadata(result, harness, "events")["paused"]
    assert f"stream {harness.source_name}.events" in said and "source column '_ingest_cdc_op'" in said
    assert "a column the product writes itself" in said and _published(harness) == ["orders"]
    _orders_exact(harness)


def _events_exact(harness: StreamHarness) -> None:
    target = harness.target_rows_where("events", ["id", "kind", "position"], "id", "_ingest_deleted_at IS NULL")
    assert target == harness.source.rows("events", "id")


def test_a_stream_added_with_a_reserved_column_is_left_out_then_copied_once_renamed(cdc: StreamHarness) -> None:
    """It was published, then every run of the source failed on its column: every stream stopped."""
    harness = cdc
    harness.source.execute(TABLES)
    _catalog(harness, "orders")
    harness.materialize()
    _catalog(harness, "orders", "events")
    harness.source.execute("UPDATE orders SET status = 'paid' WHERE id < 5; UPDATE events SET kind = 'x'")
    for new in (30, 31):  # and again: the stream stays out, the others go on
        result = harness.materialize()
        said = _metadata(result, harness, "events")["paused"]
        table = f"{harness.source.schema}.events"
        assert f"stream {harness.source_name}.events (table {table}): source column '_ingest_position'" in said
        assert "rename the source column (CDC reads tables, not views)" in said and "view that renames" not in said
        assert "is left out of this run" in said and "the other streams of source" in said
        assert _published(harness) == ["orders"]
        harness.source.execute(f"DELETE FROM orders WHERE id = {new - 20}; INSERT INTO orders VALUES ({new}, 'new')")
    harness.materialize()
    _orders_exact(harness)

    harness.source.execute("ALTER TABLE events RENAME COLUMN _ingest_position TO position")
    harness.materialize()
    harness.source.execute("UPDATE events SET kind = 'y' WHERE id = 3; DELETE FROM events WHERE id = 4")
    harness.materialize()
    assert _published(harness) == ["events", "orders"]
    _events_exact(harness)
    _orders_exact(harness)


def test_a_reserved_column_added_to_a_running_stream_pauses_it_alone(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(TABLES.replace("_ingest_position", "position"))
    _catalog(harness, "orders", "events")
    harness.materialize()
    harness.source.execute(
        "ALTER TABLE events ADD COLUMN _ingest_meta text; UPDATE events SET kind = 'x', _ingest_meta = 'm';"
        "UPDATE orders SET status = 'paid' WHERE id < 5"
    )
    result = harness.materialize()
    said = _metadata(result, harness, "events")["paused"]
    table = f"{harness.source.schema}.events"
    assert f"stream {harness.source_name}.events (table {table}): source column '_ingest_meta'" in said
    assert "it is paused" in said and _published(harness) == ["orders"]
    harness.source.execute("UPDATE events SET kind = 'z' WHERE id = 2; DELETE FROM orders WHERE id = 9")
    harness.materialize()
    _orders_exact(harness)

    harness.source.execute("ALTER TABLE events RENAME COLUMN _ingest_meta TO meta")
    harness.materialize()
    target = harness.target_rows_where("events", ["id", "kind", "position", "meta"], "id", "true")
    assert target == harness.source.rows("events", "id") and target[1][1] == "z"
    _orders_exact(harness)


def _applying(harness: StreamHarness, stream: str) -> bool:
    checkpoint = harness.checkpoint(stream)
    return checkpoint is not None and checkpoint.position is not None and not checkpoint.details.get("copy")


def test_a_reserved_column_added_while_a_live_run_streams_pauses_its_stream_alone(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(TABLES.replace("_ingest_position", "position"))
    streams: dict[str, Any] = {n: {"table": n, "primary_key": "id"} for n in ("orders", "events")}
    harness.write_catalog(streams, mode="cdc", cdc={**FAST, "live_seconds": 600, "batch_seconds": 0.3})
    process = harness.materialize_cli("orders")
    try:
        deadline = time.monotonic() + 120
        while not all(_applying(harness, name) for name in streams):  # copies done: the log is applied
            assert process.poll() is None and time.monotonic() < deadline, harness.log_text(process)[-3000:]
            time.sleep(0.5)
        harness.source.execute(
            "ALTER TABLE events ADD COLUMN _ingest_meta text; UPDATE events SET kind = 'x', _ingest_meta = 'm';"
            "UPDATE orders SET status = 'paid' WHERE id < 5"
        )
        time.sleep(3)
        harness.source.execute(
            "UPDATE orders SET status = 'late' WHERE id = 7; UPDATE events SET kind = 'z' WHERE id = 2"
        )
        time.sleep(3)
        running = process.poll() is None
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=120)
    log = "\n".join(line for line in harness.log_text(process).splitlines() if " - DEBUG - " not in line)
    print(log[-5000:])
    assert running, log[-3000:]
    harness.write_catalog(streams, mode="cdc", cdc=FAST)
    result = harness.materialize()
    said = _metadata(result, harness, "events")["paused"]
    assert "source column '_ingest_meta'" in said and "it is paused" in said
    _orders_exact(harness)
    harness.source.execute("ALTER TABLE events RENAME COLUMN _ingest_meta TO meta")
    harness.materialize()
    target = harness.target_rows_where("events", ["id", "kind", "position", "meta"], "id", "true")
    assert target == harness.source.rows("events", "id") and target[1][1] == "z"


def test_a_reserved_column_added_while_its_table_is_copied_pauses_it_alone_in_that_run(
    cdc: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy's next range read the new column: the load failed on DuckDB (`_ingest_meta_1`), every stream with
    it; then the range stopped naming the column, but the run still failed, every stream with it (a retry, if
    the source allows one, left the stream out). Now the stream is paused in that run and the others go on."""
    harness = cdc
    harness.source.execute(TABLES.replace("_ingest_position", "position"))
    streams: dict[str, Any] = {n: {"table": n, "primary_key": "id"} for n in ("orders", "events")}
    cdc_options = {**FAST, "snapshot_slice_rows": 4, "retries": {"max_attempts": 1, "delay_seconds": 0.1}}
    harness.write_catalog(streams, mode="cdc", cdc=cdc_options)
    hit = Faults.hit
    added: list[str] = []

    def add_column_after_first_range(faults: Faults, point: str, index: int) -> None:
        if point == "after_snapshot_slice" and not added:  # the DDL an application runs while the copy goes on
            harness.source.execute("ALTER TABLE events ADD COLUMN _ingest_meta text; UPDATE events SET kind = 'x'")
            added.append(point)
        hit(faults, point, index)

    monkeypatch.setattr(Faults, "hit", add_column_after_first_range)
    result = harness.materialize(raise_on_error=False)
    assert result.success
    said = _metadata(result, harness, "events")["paused"]
    table = f"{harness.source.schema}.events"
    assert f"stream {harness.source_name}.events (table {table}): source column '_ingest_meta'" in said
    assert "it is paused" in said and "the other streams of source" in said
    assert not _metadata(result, harness, "events").get("copied")  # its copy did not end: it stopped
    assert _published(harness) == ["orders"]
    _orders_exact(harness)
    harness.source.execute("UPDATE orders SET status = 'q' WHERE id < 3; UPDATE events SET kind = 'y' WHERE id = 2")
    result = harness.materialize()
    assert "source column '_ingest_meta'" in _metadata(result, harness, "events")["paused"]
    _orders_exact(harness)
    harness.source.execute("ALTER TABLE events RENAME COLUMN _ingest_meta TO meta; UPDATE orders SET status = 'p'")
    harness.materialize()
    target = harness.target_rows_where("events", ["id", "kind", "position", "meta"], "id", "true")
    assert target == harness.source.rows("events", "id") and target[1][1] == "y"
    _orders_exact(harness)
