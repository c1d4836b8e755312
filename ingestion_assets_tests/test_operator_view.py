"""What an operator sees of a stream in Dagster: the target's row count and columns, the position, the
source assets upstream, the source's job and the run's tags."""

from __future__ import annotations

import datetime as dt
import random
import time

import dagster as dg
import pyarrow as pa
import pytest

from ingestion_assets.catalog import Freshness
from ingestion_assets.cli import main
from ingestion_assets.definitions import defs
from ingestion_assets.defs.freshness import FRESHNESS, evaluate_all, freshness_policy, verdict
from ingestion_assets.defs.metadata import COLUMN_SCHEMA, POSITION, ROW_COUNT, ROWS_READ, ROWS_WRITTEN, TABLE_NAME
from ingestion_assets.defs.run_tags import GENERATION, MODE, SOURCE, _joined, _modes
from ingestion_assets.observe.commit_latency import MEASURED_TO, CommitLatency, record_counts
from ingestion_assets.observe.freshness import HIGHEST_MS, HISTOGRAM, empty, merged
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


def test_a_first_run_of_an_empty_table_does_not_speak_of_a_checkpoint(harness: StreamHarness) -> None:
    harness.source.execute("CREATE TABLE orders (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
    harness.write_catalog({"orders": {"table": "orders", "primary_key": "id", "cursor": "updated_at"}})
    first = _materialization(harness, harness.materialize())
    assert first.metadata["summary"].value == "no changes: the source holds no rows to read yet"
    harness.source.execute("INSERT INTO orders VALUES (1, now())")
    harness.materialize()
    idle = _materialization(harness, harness.materialize())
    assert idle.metadata["summary"].value == "no changes: nothing new in the source since the last checkpoint"


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


def test_a_freshness_policy_is_shown_and_enforced_by_measured_latency(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness.source.execute(ORDERS)
    spec = {"table": "orders", "primary_key": "id", "cursor": "updated_at", "freshness": {"max_lag": "1h"}}
    harness.write_catalog({"orders": spec})
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    node = defs().resolve_asset_graph().get(harness.key("orders"))
    assert node.freshness_policy == dg.FreshnessPolicy.time_window(fail_window=dt.timedelta(hours=1))

    first = harness.materialize()  # the first load is history, not lag: nothing measured, the sync is fresh
    assert HISTOGRAM not in _materialization(harness, first).metadata
    (check,) = [c for c in first.get_asset_check_evaluations() if c.check_name == FRESHNESS]
    assert check.passed

    harness.source.execute("INSERT INTO orders SELECT g, 'n', 1, 'new', now() FROM generate_series(1501, 1540) g")
    second = harness.materialize()
    metadata = _materialization(harness, second).metadata
    assert merged([str(metadata[HISTOGRAM].value)]).get_total_count() == 40  # only the new rows
    assert 0 < metadata["freshness p50 ms"].value <= metadata["freshness p99 ms"].value < 600_000
    assert [c.passed for c in second.get_asset_check_evaluations() if c.check_name == FRESHNESS] == [True]

    harness.source.execute(  # committed now, stamped two hours ago: it reached the target two hours late
        "INSERT INTO orders SELECT g, 'n', 1, 'new', now() - interval '2 hours' FROM generate_series(1541, 1545) g;"
        "UPDATE orders SET updated_at = now() WHERE id = 1501"
    )
    third = harness.materialize()
    metadata = _materialization(harness, third).metadata
    histogram = merged([str(metadata[HISTOGRAM].value)])
    assert histogram.get_total_count() == 1  # the rows stamped before the last measured time are not lag
    (latest_check,) = [c for c in third.get_asset_check_evaluations() if c.check_name == FRESHNESS]
    assert latest_check.passed  # 1501 was fresh; the late ones are below the measured time and cannot be told apart

    policies = {harness.key("orders"): Freshness(max_lag=dt.timedelta(seconds=1))}
    time.sleep(1.1)  # no run for longer than max_lag: stale (on a quiet machine the run above ended < 1 s ago)
    assert evaluate_all(harness.instance, policies) == [f"{harness.source_name}.orders"]  # the sensor's step
    latest = harness.instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [dg.AssetCheckKey(harness.key("orders"), FRESHNESS)]
    )
    assert [r.status.value for r in latest.values()] == ["FAILED"]
    assert evaluate_all(harness.instance, policies) == []  # recorded only when the verdict changes

    harness.write_catalog({"orders": {**spec, "freshness": {"max_lag": "1s"}}})
    assert main(["status"]) == 1  # `ingest status` names the stream that fell behind its max_lag
    assert f"{harness.source_name}.orders: stale:" in capsys.readouterr().err


def test_commit_latency_of_records_and_tables_in_hdr_buckets() -> None:
    now = dt.datetime.now(dt.UTC)
    floor = now - dt.timedelta(hours=3)
    latency = CommitLatency("updated_at", floor)
    records = [{"updated_at": (now - dt.timedelta(seconds=s)).isoformat()} for s in (1, 2, 3)]
    records += [{"updated_at": "2020-01-01T00:00:00Z"}, {"updated_at": "2099-01-01T00:00:00"}, {"updated_at": 5}]
    latency.observe(records, now)  # an old time (measured before), a local time and a number are not counted
    table = pa.table(
        {"updated_at": pa.array([now - dt.timedelta(minutes=m) for m in (10, 20)], pa.timestamp("us", "UTC"))}
    )
    latency.observe(table, now)
    assert latency.histogram.get_total_count() == 5
    assert abs(latency.histogram.get_value_at_percentile(100) - 1_200_000) <= 1_200_000 / 1000
    details: dict[str, object] = {}
    latency.finish(details, {})
    assert details[MEASURED_TO] == (now - dt.timedelta(seconds=1)).isoformat()

    rng = random.Random(7)
    values = [min(max(int(rng.lognormvariate(8, 3)), 1), HIGHEST_MS) for _ in range(20_000)]
    bulk, one_by_one = empty(), empty()
    record_counts(bulk, pa.array(values))
    for value in values:
        one_by_one.record_value(value)
    assert [bulk.get_value_at_percentile(p) for p in (50, 95, 99, 99.9)] == [
        one_by_one.get_value_at_percentile(p) for p in (50, 95, 99, 99.9)
    ]


def test_freshness_in_the_catalog() -> None:
    assert Freshness.model_validate({"max_lag": "15m"}).max_lag == dt.timedelta(minutes=15)
    assert Freshness.model_validate({"max_lag": 90, "warn_lag": "1m"}).warn_lag == dt.timedelta(minutes=1)
    for bad in ({"max_lag": "0s"}, {"max_lag": "1h", "warn_lag": "2h"}, {"max_lag": "soon"}):
        with pytest.raises(ValueError):
            Freshness.model_validate(bad)


def test_a_freshness_window_under_a_minute_loads_dagster_shows_the_shortest_it_takes() -> None:
    """Dagster refuses policy windows under a minute: the definitions still load, the check keeps the value."""
    short = Freshness.model_validate({"max_lag": "45s", "warn_lag": "30s"})
    policy = freshness_policy(short)
    assert policy is not None and policy.fail_window.to_timedelta() == dt.timedelta(minutes=1)
    assert policy.warn_window is None
    passed, _, figures = verdict(short, 50.0, None)
    assert not passed and figures["max lag seconds"] == 45
    both = freshness_policy(Freshness.model_validate({"max_lag": "90s", "warn_lag": "30s"}))
    assert both is not None and both.fail_window.to_timedelta() == dt.timedelta(seconds=90)
