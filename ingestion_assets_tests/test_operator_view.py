"""What an operator sees of a stream in Dagster: the target's row count and columns, the position, the
source assets upstream, the source's job and the run's tags."""

from __future__ import annotations

import dagster as dg
import pytest

from ingestion_assets.definitions import defs
from ingestion_assets.defs.metadata import COLUMN_SCHEMA, POSITION, ROW_COUNT, ROWS_READ, ROWS_WRITTEN, TABLE_NAME
from ingestion_assets.defs.run_tags import GENERATION, MODE, SOURCE, _joined, _modes
from ingestion_assets.state.summary import request_refresh
from ingestion_assets_tests.helpers import META_COLUMNS, StreamHarness

ORDERS = """
CREATE TABLE orders (
    id bigint PRIMARY KEY, customer text, amount numeric(12,2), status text NOT NULL, updated_at timestamptz NOT NULL
);
INSERT INTO orders SELECT g, 'c' || g % 7, g * 1.5, 'new', timestamptz '2024-01-01 00:00:00+00' + g * interval '1 s'
FROM generate_series(1, 1500) g;
"""


def _materialization(harness: StreamHarness, result: dg.ExecuteInProcessResult) -> dg.AssetMaterialization:
    return result.asset_materializations_for_node(f"{harness.source_name}__orders")[0]


@pytest.fixture
def orders(harness: StreamHarness, monkeypatch: pytest.MonkeyPatch) -> StreamHarness:
    harness.source.execute(ORDERS)
    harness.write_catalog(
        {"orders": {"table": "orders", "primary_key": "id", "cursor": "updated_at", "slice_rows": 600}},
        schedule="*/15 * * * *",
    )
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    return harness


def test_the_asset_page_shows_the_table_not_the_read(orders: StreamHarness) -> None:
    harness = orders
    first = _materialization(harness, harness.materialize())
    assert first.metadata[ROW_COUNT].value == harness.target_count("orders") == 1500
    schema = first.metadata[COLUMN_SCHEMA].value
    assert isinstance(schema, dg.TableSchema)
    names = [c.name for c in schema.columns]
    assert names[:5] == harness.source.columns("orders") and set(META_COLUMNS) <= set(names)
    by_name = {c.name: c for c in schema.columns}
    assert by_name["id"].constraints.unique and not by_name["id"].constraints.nullable
    assert by_name["customer"].constraints.nullable and by_name["amount"].type == "DECIMAL(12,2)"
    assert schema.constraints.other == ["primary key (id)"]
    checkpoint = harness.checkpoint("orders")
    assert checkpoint is not None and first.metadata[POSITION].value == checkpoint.position
    assert first.metadata["ingest/checkpoint"].value["position"] == checkpoint.position  # the full one stays

    harness.source.execute(
        "UPDATE orders SET status = 'paid', updated_at = updated_at + interval '1 day' WHERE id <= 100;"
        "INSERT INTO orders SELECT g, 'late', 1, 'new', now() FROM generate_series(1501, 1520) g;"
    )
    second = _materialization(harness, harness.materialize())
    assert second.metadata[ROWS_READ].value == second.metadata[ROWS_WRITTEN].value == 120
    assert second.metadata[ROW_COUNT].value == harness.target_count("orders") == 1520  # not the 120 read

    idle = _materialization(harness, harness.materialize())
    assert idle.metadata[ROWS_READ].value == 0 and str(idle.metadata["summary"].value).startswith("no changes")
    assert idle.metadata[ROW_COUNT].value == 1520


def test_lineage_jobs_and_run_tags(orders: StreamHarness) -> None:
    harness = orders
    harness.materialize()
    definitions = defs()
    graph = definitions.resolve_asset_graph()
    source_key = dg.AssetKey(["source", harness.source_name, harness.source.schema, "orders"])
    stream = graph.get(harness.key("orders"))
    assert stream.parent_keys == {source_key}
    source = graph.get(source_key)
    assert not source.is_materializable and source.kinds == {"postgres"} and source.description
    assert source.metadata["table"] == f"{harness.source.schema}.orders"
    assert stream.metadata[TABLE_NAME] == f"{harness.source_name}.orders"
    columns = stream.metadata[COLUMN_SCHEMA]  # the last materialization's, on the definition
    assert isinstance(columns, dg.TableSchema) and columns.columns[0].name == "id"

    job_name = f"{harness.source_name}__job"
    schedule = definitions.resolve_schedule_def(f"{harness.source_name}__sync")
    assert schedule.job_name == job_name
    result = definitions.resolve_job_def(job_name).execute_in_process(instance=harness.instance)
    assert result.success
    tags = harness.instance.get_run_by_id(result.run_id).tags  # type: ignore[union-attr]
    assert tags[SOURCE] == harness.source_name and tags[MODE] == "incremental" and tags[GENERATION] == "1"

    request_refresh(harness.settings, harness.source_name, "orders", "remove")  # what `ingest refresh` does
    refreshed = harness.materialize()
    tags = harness.instance.get_run_by_id(refreshed.run_id).tags  # type: ignore[union-attr]
    assert tags[MODE] == "refresh" and tags[GENERATION] == "2"
    assert _materialization(harness, refreshed).metadata[ROW_COUNT].value == 1500


def test_a_run_of_several_streams_names_every_source_and_mode() -> None:
    assert _joined(_joined(None, "shop"), "demo_api") == "demo_api,shop"
    assert _modes(_modes("incremental", "incremental"), "refresh") == "refresh"  # the launch tag gives way
    assert _modes("refresh", "backfill") == "backfill,refresh"
