"""The code location Dagster loads: assets per stream, schedules from the catalog, the key-range planner."""

from __future__ import annotations

import datetime as dt
import logging

import dagster as dg
import pytest

from ingestion_assets.cli import main
from ingestion_assets.definitions import defs
from ingestion_assets.partitions import LIVE
from ingestion_assets_tests.helpers import StreamHarness

TABLE = """
CREATE TABLE events (id bigint PRIMARY KEY, kind text, updated_at timestamptz NOT NULL);
INSERT INTO events SELECT g, 'k', now() - g * interval '1 minute' FROM generate_series(1, 2500) g;
"""


@pytest.fixture
def loaded(harness: StreamHarness, monkeypatch: pytest.MonkeyPatch) -> tuple[StreamHarness, dg.Definitions]:
    harness.source.execute(TABLE)
    start = (dt.datetime.now(dt.UTC) - dt.timedelta(days=2)).date().isoformat()
    harness.write_catalog(
        {
            "events": {"table": "events", "primary_key": "id", "cursor": "updated_at"},
            "by_key": {
                "table": "events",
                "primary_key": "id",
                "cursor": "updated_at",
                "partitions": {"by": "key", "chunk": 1000},
            },
            "by_day": {
                "table": "events",
                "primary_key": "id",
                "cursor": "updated_at",
                "partitions": {"by": "time", "column": "updated_at", "start": start},
            },
        },
        schedule="*/10 * * * *",
    )
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    return harness, defs()


def test_every_stream_is_an_asset_grouped_by_source(loaded: tuple[StreamHarness, dg.Definitions]) -> None:
    harness, definitions = loaded
    graph = definitions.resolve_asset_graph()
    keys = {k for k in graph.get_all_asset_keys()}
    source_table = dg.AssetKey(["source", harness.source_name, harness.source.schema, "events"])  # one for three
    assert keys == {harness.key("events"), harness.key("by_key"), harness.key("by_day"), source_table}
    assert {graph.get(k).group_name for k in keys} == {harness.source_name}
    assert all(graph.get(harness.key(s)).parent_keys == {source_table} for s in ("events", "by_key", "by_day"))
    assert graph.get(harness.key("by_day")).partitions_def is not None


def test_schedules_sync_plain_streams_and_the_newest_partition(loaded: tuple[StreamHarness, dg.Definitions]) -> None:
    harness, definitions = loaded
    names = {s.name for s in definitions.schedules or []}
    source = harness.source_name
    assert names == {f"{source}__sync", f"{source}__by_key__newest", f"{source}__by_day__newest"}

    by_day = definitions.resolve_schedule_def(f"{source}__by_day__newest")
    with dg.build_schedule_context(
        instance=harness.instance, repository_def=definitions.get_repository_def()
    ) as context:
        request = by_day.evaluate_tick(context).run_requests[0]
    assert request.partition_key == dt.datetime.now(dt.UTC).date().isoformat()

    by_key = definitions.resolve_schedule_def(f"{source}__by_key__newest")
    with dg.build_schedule_context(
        instance=harness.instance, repository_def=definitions.get_repository_def()
    ) as context:
        assert by_key.evaluate_tick(context).skip_message  # no ranges planned yet


def test_the_planner_sensor_adds_key_ranges_and_the_live_tail_once(
    loaded: tuple[StreamHarness, dg.Definitions], capsys: pytest.CaptureFixture[str]
) -> None:
    harness, definitions = loaded
    sensor = definitions.resolve_sensor_def(f"{harness.source_name}__by_key__plan_key_ranges")
    with dg.build_sensor_context(instance=harness.instance) as context:
        sensor.evaluate_tick(context)
    keys = harness.instance.get_dynamic_partitions(f"{harness.source_name}__by_key__keys")
    assert keys == ["0-999", "1000-1999", "2000-2999", LIVE]
    live = harness.checkpoint("by_key", LIVE)
    assert live is not None and live.details["planned"] is True and live.position is not None

    harness.source.execute("INSERT INTO events SELECT g, 'new', now() FROM generate_series(2501, 3200) g")
    with dg.build_sensor_context(instance=harness.instance) as context:
        sensor.evaluate_tick(context)
    keys = harness.instance.get_dynamic_partitions(f"{harness.source_name}__by_key__keys")
    assert keys == ["0-999", "1000-1999", "2000-2999", LIVE, "3000-3999"]

    harness.materialize("by_key", partition_range=("0-999", "2000-2999"))  # a range never takes in `live` unnamed
    harness.materialize("by_key", partition_range=("3000-3999", "3000-3999"))
    harness.materialize("by_key", partition=LIVE)
    assert harness.assert_target_equals_source("by_key", "events", "id") == 3200

    assert main(["state", "show", f"{harness.source_name}.by_key"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in shown[1:]] == ["live", "0-999", "1000-1999", "2000-2999", "3000-3999"]


def test_a_run_on_an_ephemeral_instance_says_it_reads_from_the_start(harness: StreamHarness) -> None:
    """`dagster asset materialize` with DAGSTER_HOME unset runs on a throwaway instance: it finds none of the
    deployment's checkpoints and re-read a whole table without a word (attack27). It says so."""
    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.defs.assets import build_stream_assets

    harness.source.execute(TABLE)
    harness.write_catalog({"events": {"table": "events", "primary_key": "id", "cursor": "updated_at"}})
    assets = build_stream_assets(harness.settings, load_catalog(harness.settings.catalog_path))
    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize(assets, instance=instance)
        logs = instance.all_logs(result.run_id)
        warnings = [e.message for e in logs if e.level == logging.WARNING and "ephemeral" in e.message]
    assert result.success and warnings and "DAGSTER_HOME" in warnings[0] and "read from its start" in warnings[0]
