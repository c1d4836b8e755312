"""A column dropped in one run and added again in a later one: the target kept the dropped column with its old
values, the source's new column holds NULL in every existing row, and the run that adds it must not leave the old
values there (found by a README-only attack: the run read nothing again and target != source, every check ok)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from ingestion_assets.cli import main
from ingestion_assets.partitions import LIVE
from ingestion_assets_tests.destination_targets import MariaDb, lake_rows, mariadb, use_destination
from ingestion_assets_tests.helpers import NEWEST_ROW, StreamHarness

__all__ = ["mariadb"]

TABLE = """
CREATE TABLE items (id int PRIMARY KEY, note text, qty int, updated_at timestamptz NOT NULL);
INSERT INTO items SELECT g, 'n' || g, g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 s'
FROM generate_series(1, 150) g;
"""
DROP = "ALTER TABLE items DROP COLUMN note; UPDATE items SET qty = -qty, updated_at = now() WHERE id <= 5"
ADD_AGAIN = {  # the column comes back without a default: NULL in every existing row
    "same type": "ALTER TABLE items ADD COLUMN note text",
    "other type": "ALTER TABLE items ADD COLUMN note bigint",
}
AFTER_ADD = "UPDATE items SET note = DEFAULT, updated_at = now() WHERE id = 7"  # one row moves its cursor


def _metadata(harness: StreamHarness, result: Any, stream: str = "items") -> dict[str, Any]:
    return dict(result.asset_materializations_for_node(f"{harness.source_name}__{stream}")[0].metadata)


def _accept(harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert not harness.materialize(raise_on_error=False).success  # paused
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["schema", "accept", f"{harness.source_name}.items"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("destination", ["duckdb", pytest.param("postgres", marks=pytest.mark.slow)])
@pytest.mark.parametrize("policy", ["evolve", "columns_only", "pause"])
@pytest.mark.parametrize("added", list(ADD_AGAIN))
def test_a_column_dropped_then_added_again_in_a_later_run_reads_every_row_again(
    harness: StreamHarness,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    destination: str,
    policy: str,
    added: str,
) -> None:
    harness.source.execute(TABLE)
    spec = {"table": "items", "primary_key": "id", "cursor": "updated_at", "slice_rows": 64, "schema_policy": policy}
    harness.write_catalog({"items": {**spec, "retries": {"max_attempts": 1}}}, destination=destination)
    harness.materialize()
    harness.source.execute(DROP)
    if policy == "pause":
        _accept(harness, monkeypatch, capsys)
    harness.materialize()  # the target keeps `note` with its old values (by design)
    harness.assert_target_equals_source("items", "items", "id")
    harness.source.execute(f"{ADD_AGAIN[added]}; {AFTER_ADD}")
    if policy == "pause":
        _accept(harness, monkeypatch, capsys)
    result = harness.materialize()
    harness.assert_target_equals_source("items", "items", "id")  # NULL in `note` where the source holds NULL
    metadata = _metadata(harness, result)
    assert "note" in str(metadata["started over"].value) and "values" in str(metadata["started over"].value)
    assert metadata["rows read"].value == 150
    harness.source.execute("UPDATE items SET updated_at = now() WHERE id = 9")
    result = harness.materialize()  # the column is stored now: the next run reads on
    assert _metadata(harness, result)["rows read"].value == 1
    harness.assert_target_equals_source("items", "items", "id")


def test_a_column_added_again_over_a_target_column_of_nulls_reads_nothing_again(harness: StreamHarness) -> None:
    """The target column holds no value (it never had one): nothing to clear, so nothing is read again."""
    harness.source.execute(TABLE + "UPDATE items SET note = NULL;")
    spec = {"table": "items", "primary_key": "id", "cursor": "updated_at", "slice_rows": 64}
    harness.write_catalog({"items": spec})
    harness.materialize()
    harness.source.execute(DROP)
    harness.materialize()
    harness.source.execute(f"{ADD_AGAIN['same type']}; {AFTER_ADD}")
    result = harness.materialize()
    metadata = _metadata(harness, result)
    assert metadata["rows read"].value == 1 and "started over" not in metadata
    harness.assert_target_equals_source("items", "items", "id")


def test_a_column_added_again_under_key_ranges_is_read_again_by_live_and_each_range(harness: StreamHarness) -> None:
    harness.source.execute(TABLE)
    spec = {"table": "items", "primary_key": "id", "cursor": "updated_at", "partitions": {"by": "key", "chunk": 50}}
    harness.write_catalog({"items": spec})
    keys = harness.plan_partitions("items")
    harness.materialize(partition_range=(keys[0], keys[-2]))
    harness.materialize(partition=LIVE)
    harness.source.execute(DROP)
    harness.materialize(partition=LIVE)
    harness.source.execute(f"{ADD_AGAIN['same type']}; {AFTER_ADD}")
    result = harness.materialize(partition=LIVE)
    assert "note" in str(_metadata(harness, result)["started over"].value)
    harness.assert_target_equals_source("items", "items", "id")
    for key in keys[:-1]:  # each range reads its rows again too, changing nothing
        harness.materialize(partition=key)
    harness.assert_target_equals_source("items", "items", "id")


@pytest.mark.parametrize("newest", [pytest.param("today", marks=pytest.mark.slow), "yesterday"])
def test_a_column_added_again_under_time_windows_names_the_windows_left_to_run(
    harness: StreamHarness, newest: str
) -> None:
    """A window reads its own rows again; windows already past keep the old values until they run (as for a type
    change): the run says so, and running them makes the target equal, also when the running window is empty."""
    harness.source.execute(
        "CREATE TABLE items (id int PRIMARY KEY, note text, updated_at timestamptz NOT NULL);"
        f"INSERT INTO items SELECT g, 'n' || g, {NEWEST_ROW[newest]} - g * interval '1 hour'"
        " FROM generate_series(1, 60) g"
    )
    windows = {"by": "time", "column": "updated_at", "start": "2020-01-01", "granularity": "daily"}
    harness.write_catalog(
        {"items": {"table": "items", "primary_key": "id", "cursor": "updated_at", "partitions": windows}}
    )
    today = dt.datetime.now(dt.UTC).date()
    days = [(today - dt.timedelta(days=i)).isoformat() for i in range(4)]
    for day in reversed(days):
        harness.materialize(partition=day)
    harness.source.execute("ALTER TABLE items DROP COLUMN note")
    for day in reversed(days):
        harness.materialize(partition=day)
    harness.source.execute(ADD_AGAIN["same type"])
    result = harness.materialize(partition=days[0])
    said = str(_metadata(harness, result)["started over"].value)
    assert "note" in said and "every other partition" in said and "--partition-range" in said
    for day in days[1:]:
        harness.materialize(partition=day)
    harness.assert_target_equals_source("items", "items", "id")


def test_under_ignore_a_column_added_again_is_not_read_until_the_policy_reads_it(
    harness: StreamHarness,
) -> None:
    """`ignore` does not read the column added again: the target's column stays the dropped one's (old values, NULL
    in rows read since). Once the policy reads it (`evolve`), the run that adds it reads every row again."""
    harness.source.execute(TABLE)
    spec = {"table": "items", "primary_key": "id", "cursor": "updated_at", "schema_policy": "ignore"}
    harness.write_catalog({"items": spec})
    harness.materialize()
    harness.source.execute(DROP)
    harness.materialize()
    harness.source.execute(f"{ADD_AGAIN['same type']}; {AFTER_ADD}")
    result = harness.materialize()
    assert _metadata(harness, result)["rows read"].value == 1  # the column is not read: nothing to read again
    kept = harness.query_target(
        f'SELECT id, note FROM "{harness.source_name}".items WHERE id IN (1, 7, 100) ORDER BY id'
    )
    assert kept == [(1, None), (7, None), (100, "n100")]  # the dropped column's: NULL in rows read after the drop
    harness.write_catalog({"items": {**spec, "schema_policy": "evolve"}})
    result = harness.materialize()
    assert "note" in str(_metadata(harness, result)["started over"].value)
    harness.assert_target_equals_source("items", "items", "id")


@pytest.mark.parametrize(
    "destination", [pytest.param("mariadb", marks=pytest.mark.slow), "delta", pytest.param("iceberg", marks=pytest.mark.slow)]
)
def test_a_column_dropped_then_added_again_on_other_targets(
    harness: StreamHarness, mariadb: MariaDb, tmp_path: Any, destination: str
) -> None:
    """MariaDB/MySQL and the lakes: the run reads their columns too (each its own way) before it counts."""
    harness.source.execute(TABLE)
    harness.write_catalog({"items": {"table": "items", "primary_key": "id", "cursor": "updated_at", "slice_rows": 64}})
    lake = tmp_path / "lake"
    if destination == "mariadb":
        use_destination(harness, mariadb.destination())
        mariadb.datasets.append(harness.source_name)
    else:
        use_destination(harness, {"type": "filesystem", "bucket_url": str(lake), "table_format": destination})

    def target() -> list[Any]:
        columns = harness.source.columns("items")
        if destination == "mariadb":
            return mariadb.rows(harness.source_name, "items", columns, "id")
        return lake_rows(destination, str(lake / harness.source_name / "items"), columns, "id")

    harness.materialize()
    harness.source.execute(DROP)
    harness.materialize()
    harness.source.execute(f"{ADD_AGAIN['same type']}; {AFTER_ADD}")
    result = harness.materialize()
    assert "note" in str(_metadata(harness, result)["started over"].value)
    assert target() == harness.source.rows("items", "id")


def test_a_column_ignored_for_a_while_is_read_in_full_once_the_policy_reads_it(harness: StreamHarness) -> None:
    """Under `ignore` a column added without a default is skipped while rows fill it (their cursor moves, they are
    read without it). Once the policy reads it (`evolve`) it is an added column to the stored schema, but not a new
    one: its rows hold values the target never got, so the run reads every row again."""
    harness.source.execute(TABLE)
    spec = {"table": "items", "primary_key": "id", "cursor": "updated_at", "schema_policy": "ignore"}
    harness.write_catalog({"items": spec})
    harness.materialize()
    harness.source.execute(
        "ALTER TABLE items ADD COLUMN color text; UPDATE items SET color = 'red', updated_at = now() WHERE id <= 10"
    )
    assert _metadata(harness, harness.materialize())["rows read"].value == 10  # read without `color`
    harness.write_catalog({"items": {**spec, "schema_policy": "evolve"}})
    result = harness.materialize()
    assert "color" in str(_metadata(harness, result)["started over"].value)
    harness.assert_target_equals_source("items", "items", "id")
    harness.source.execute("ALTER TABLE items ADD COLUMN later text; UPDATE items SET updated_at = now() WHERE id = 2")
    result = harness.materialize()  # a column new since the last run: NULL in every existing row, nothing to read again
    assert _metadata(harness, result)["rows read"].value == 1
    harness.assert_target_equals_source("items", "items", "id")
