"""A checkpoint belongs to one target: a new destination file, a dropped or emptied table, or a target restored
from an older copy makes the next run re-read from the start, never load a silent tail."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import dagster as dg
import duckdb
import yaml

__all__ = ["api"]  # the demo API fixture

from ingestion_assets.demo.api_server import DemoApi
from ingestion_assets.state.checkpoints import InstanceStateStore
from ingestion_assets_tests.helpers import SourceDb, StreamHarness
from ingestion_assets_tests.test_api_streams import _assert_target_equals_server, _catalog, api

ITEMS = """
CREATE TABLE items (id int PRIMARY KEY, name text, updated_at timestamptz NOT NULL);
INSERT INTO items SELECT g, 'item ' || g, timestamptz '2024-01-01+00' + g * interval '1 second'
FROM generate_series(1, 5000) g;
"""


def _catalog_at(harness: StreamHarness, warehouse: Path) -> None:
    catalog = yaml.safe_load(harness.catalog_path.read_text())  # type: ignore[union-attr]
    catalog["destination"]["path"] = str(warehouse)
    harness.catalog_path.write_text(yaml.safe_dump(catalog))  # type: ignore[union-attr]


def _prepare(harness: StreamHarness) -> None:
    harness.source.execute(ITEMS)
    harness.write_catalog({"items": {"table": "items", "primary_key": "id", "cursor": "updated_at", "slice_rows": 1000}})
    harness.materialize()
    harness.source.execute("INSERT INTO items VALUES (5001, 'late', now()); UPDATE items SET name = 'x', updated_at = now() WHERE id = 3")
    harness.materialize()


def _rows_read(harness: StreamHarness, result: dg.ExecuteInProcessResult) -> int:
    materialization = result.asset_materializations_for_node(f"{harness.source_name}__items")[0]
    return int(materialization.metadata["rows read"].value)


def _started_over(harness: StreamHarness, result: dg.ExecuteInProcessResult, node: str = "items") -> str:
    materialization = result.asset_materializations_for_node(f"{harness.source_name}__{node}")[0]
    entry = materialization.metadata.get("started over")
    return "" if entry is None else str(entry.value)


def test_a_new_destination_file_gets_every_row_not_the_tail(harness: StreamHarness) -> None:
    _prepare(harness)
    second = harness.tmp_path / "second.duckdb"
    _catalog_at(harness, second)
    harness.source.execute("UPDATE items SET name = 'y', updated_at = now() WHERE id = 4")
    result = harness.materialize()
    assert _rows_read(harness, result) == 5001
    assert "holds no record of this stream" in _started_over(harness, result)
    with duckdb.connect(str(second), read_only=True) as con:
        copied = con.sql(f"SELECT id, name FROM {harness.source_name}.items ORDER BY id").fetchall()
    assert copied == harness.query_source("SELECT id, name FROM items ORDER BY id")

    _catalog_at(harness, harness.warehouse)  # back to the first file: it holds another copy than the checkpoint's
    harness.source.execute("UPDATE items SET name = 'z', updated_at = now() WHERE id = 5")
    result = harness.materialize()
    assert _rows_read(harness, result) == 5001
    assert "holds another copy of this stream" in _started_over(harness, result)
    harness.assert_target_equals_source("items", "items", "id")
    assert _rows_read(harness, harness.materialize()) == 0  # bound again: incremental from here


def test_a_dropped_or_emptied_target_table_is_read_again(harness: StreamHarness) -> None:
    _prepare(harness)
    for statement in (f"DROP TABLE {harness.source_name}.items", f"DELETE FROM {harness.source_name}.items"):
        with duckdb.connect(str(harness.warehouse)) as con:
            con.execute(statement)
        result = harness.materialize()
        assert _rows_read(harness, result) == 5001
        assert "missing or empty" in _started_over(harness, result)
        harness.assert_target_equals_source("items", "items", "id")


def test_a_target_restored_from_an_older_copy_is_read_again(harness: StreamHarness) -> None:
    harness.source.execute(ITEMS)
    harness.write_catalog({"items": {"table": "items", "primary_key": "id", "cursor": "updated_at", "slice_rows": 1000}})
    harness.materialize()
    backup = harness.tmp_path / "backup.duckdb"
    shutil.copy(harness.warehouse, backup)
    harness.source.execute("INSERT INTO items SELECT g, 'more', now() FROM generate_series(5001, 5100) g")
    harness.materialize()
    shutil.copy(backup, harness.warehouse)  # the warehouse is restored: it lacks the last 100 rows
    result = harness.materialize()
    assert "restored from an older copy" in _started_over(harness, result)
    harness.assert_target_equals_source("items", "items", "id")


def test_a_checkpoint_from_before_binding_is_adopted_when_the_target_holds_rows(harness: StreamHarness) -> None:
    _prepare(harness)
    state = harness.checkpoint("items")
    assert state is not None and "target" in state.details
    legacy = {k: v for k, v in state.details.items() if k != "target"}
    InstanceStateStore(harness.instance, harness.key("items")).commit(None, state.position, **legacy)
    with duckdb.connect(str(harness.warehouse)) as con:
        con.execute(f"DROP TABLE {harness.source_name}._ingest_bindings")
    assert _rows_read(harness, harness.materialize()) == 0  # continued, not re-read
    harness.assert_target_equals_source("items", "items", "id")
    state = harness.checkpoint("items")
    assert state is not None and state.details["target"]["seq"] == 0


def test_an_api_stream_pointed_at_a_new_file_reads_everything_again(harness: StreamHarness, api: DemoApi) -> None:
    _catalog(harness, api)
    harness.materialize()
    api.mutate("orders", inserts=5, updates=5)
    harness.materialize()
    second = harness.tmp_path / "second.duckdb"
    _catalog_at(harness, second)
    assert "holds no record" in _started_over(harness, harness.materialize(), "orders")
    harness.tmp_path.joinpath("warehouse.duckdb").unlink()
    shutil.copy(second, harness.warehouse)
    _assert_target_equals_server(harness, api)


def test_a_postgres_target_records_its_binding_and_a_dropped_table_is_read_again(harness: StreamHarness) -> None:
    harness.source.execute(ITEMS)
    harness.write_catalog(
        {"items": {"table": "items", "primary_key": "id", "cursor": "updated_at", "slice_rows": 1000}},
        destination="postgres",
    )
    harness.materialize()
    state = harness.checkpoint("items")
    assert state is not None
    marker = harness.query_target(
        f'SELECT binding, seq FROM "{harness.source_name}"._ingest_bindings WHERE stream = \'items\''
    )
    assert marker == [(state.details["target"]["binding"], state.details["target"]["seq"])]
    harness.source.execute(f'DROP TABLE "{harness.source_name}".items')
    result = harness.materialize()
    assert _rows_read(harness, result) == 5000 and "missing or empty" in _started_over(harness, result)
    harness.assert_target_equals_source("items", "items", "id")


def test_first_loads_into_one_postgres_schema_at_once_create_the_bindings_table_once(source_db: SourceDb) -> None:
    """Backfill workers' first slices race on CREATE TABLE IF NOT EXISTS (pg_type's unique index): none fails."""
    import threading

    import dlt
    from dlt.destinations.impl.postgres.configuration import PostgresCredentials

    from ingestion_assets.loading.bindings import ensure_table

    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def create() -> None:
        try:
            credentials = PostgresCredentials(source_db.url)
            credentials.password = credentials.password or ""  # trust auth, as make_destination does
            pipeline = dlt.pipeline(
                pipeline_name=f"race_{uuid.uuid4().hex[:8]}",
                destination=dlt.destinations.postgres(credentials),
                dataset_name=source_db.schema,
            )
            with pipeline.sql_client() as client:
                start.wait(timeout=60)
                ensure_table(client)
        except Exception as exc:  # noqa: BLE001 - every failure is the finding
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert source_db.rows("_ingest_bindings", "stream") == []
